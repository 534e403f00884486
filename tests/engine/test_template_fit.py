"""Fitting conversations to each family's chat template: the probed traits, the rewrites, and
golden rendered prompts (tests/data/family_prompts/, read by eye once; docs/models.md).

Set VLMSERVE_UPDATE_GOLDEN=1 to rewrite the golden files after a deliberate change.
"""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from tests._family_models import FAMILY_NAMES
from vlmserve.engine.prep.lowering import lower_messages
from vlmserve.engine.prep.prompt import render_prompt
from vlmserve.engine.template_fit import TemplateTraits, fit_messages, probe
from vlmserve.engine.toolcalls.registry import HERMES_FORMAT
from vlmserve.engine.v1 import engine_pb2 as pb

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "data" / "family_prompts"

# (tools, tool calls, tool turns, short call ids, later system, consecutive turns, string content)
EXPECTED_TRAITS = {
    "qwen2_5_vl": (False, False, True, True, True, True, False),
    "qwen3_vl": (True, True, True, True, False, True, False),
    "qwen3_vl_thinking": (True, True, True, True, True, True, False),
    "qwen3_vl_moe": (True, True, True, True, False, True, False),
    "qwen3_5": (True, True, True, True, False, True, False),
    "qwen3_5_moe": (True, True, True, True, False, True, False),
    "gemma3": (False, False, False, True, False, False, False),
    "gemma4": (True, True, True, True, True, True, False),
    "idefics3": (False, False, False, True, True, True, False),
    # Its alternation check builds its list inside a for loop, where jinja's `set` does not
    # persist, so it never fires: consecutive turns render.
    "mistral3": (True, True, True, False, False, True, False),
    "llama4": (True, True, True, True, True, True, True),
    "llava": (False, False, False, True, True, True, False),
    "glm4v": (True, True, True, True, True, True, False),
    "glm4v_moe": (True, True, True, True, True, True, False),
}


@pytest.fixture(scope="module")
def tokenizers(family_models: dict[str, Path]) -> dict[str, Any]:
    return {name: AutoTokenizer.from_pretrained(str(path)) for name, path in family_models.items()}


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_probed_traits(name: str, tokenizers: dict[str, Any]) -> None:
    traits = probe(tokenizers[name])
    assert (
        traits.renders_tools,
        traits.renders_tool_calls,
        traits.renders_tool_turns,
        traits.accepts_short_call_ids,
        traits.renders_later_system,
        traits.accepts_consecutive_turns,
        traits.needs_string_content_with_tools,
    ) == EXPECTED_TRAITS[name]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_only_gemma4_prints_a_system_part_list(name: str, tokenizers: dict[str, Any]) -> None:
    """Gemma 4's template trims the first system turn's content as a string (a list of parts
    came out as its Python repr): the engine passes it a string."""
    assert probe(tokenizers[name]).needs_string_system == (name == "gemma4")


# -- the rewrites, on plain traits ---------------------------------------------------------------

TOOL = {"type": "function", "function": {"name": "shell", "parameters": {"type": "object"}}}
HISTORY: list[dict[str, Any]] = [
    {
        "role": "system",
        "content": [{"type": "text", "text": "Be brief."}, {"type": "text", "text": "\n\nJSON."}],
    },
    {"role": "user", "content": [{"type": "text", "text": "list files"}]},
    {
        "role": "assistant",
        "content": [],
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "shell", "arguments": {"cmd": "ls"}}}
        ],
    },
    {"role": "tool", "content": "a.txt", "tool_call_id": "c1"},
    {"role": "user", "content": [{"type": "image"}]},
]


def test_everything_native_changes_only_the_system_parts() -> None:
    messages, tools = fit_messages(HISTORY, [TOOL], TemplateTraits())
    assert tools == [TOOL]
    assert messages[0]["content"] == [{"type": "text", "text": "Be brief.\n\nJSON."}]
    assert messages[1:] == HISTORY[1:]


def test_tools_the_template_drops_become_hermes_text() -> None:
    original = copy.deepcopy(HISTORY)
    messages, tools = fit_messages(HISTORY, [TOOL], TemplateTraits(renders_tools=False))
    assert tools is None
    system = messages[0]["content"][0]["text"]
    assert system.startswith("Be brief.\n\nJSON.\n\n# Tools\n")
    assert json.dumps(TOOL) in system
    assert messages[2] == {
        "role": "assistant",
        "content": [
            {
                "type": "text",
                "text": '<tool_call>\n{"name": "shell", "arguments": {"cmd": "ls"}}\n</tool_call>',
            }
        ],
    }
    assert messages[3] == {
        "role": "user",
        "content": [{"type": "text", "text": "<tool_response>\na.txt\n</tool_response>"}],
    }
    assert original == HISTORY  # the caller's messages are untouched


def test_alternating_templates_get_merged_turns_and_no_later_system() -> None:
    conversation = [
        *HISTORY,
        {"role": "system", "content": [{"type": "text", "text": "Now in French."}]},
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
    ]
    traits = TemplateTraits(
        renders_tools=False,
        renders_tool_turns=False,
        renders_later_system=False,
        accepts_consecutive_turns=False,
    )
    messages, _ = fit_messages(conversation, None, traits)
    roles = [m["role"] for m in messages]
    assert roles == ["system", "user", "assistant", "user"]
    last = messages[-1]["content"]
    assert [part.get("text") for part in last] == [
        "<tool_response>\na.txt\n</tool_response>",
        "\n\n",
        None,  # the image
        "\n\n",
        "Now in French.",
        "\n\n",
        "go",
    ]


def test_consecutive_tool_results_share_one_user_turn() -> None:
    conversation = [
        HISTORY[1],
        {
            "role": "assistant",
            "content": [],
            "tool_calls": [
                {"id": "call_aaaaaaaaa", "type": "function", "function": {"name": "a", "arguments": "{}"}},
                {"id": "call_bbbbbbbbb", "type": "function", "function": {"name": "b", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "content": "A", "tool_call_id": "call_aaaaaaaaa"},
        {"role": "tool", "content": "B", "tool_call_id": "call_bbbbbbbbb"},
    ]
    messages, _ = fit_messages(conversation, None, TemplateTraits(renders_tool_calls=False))
    assert messages[-1] == {
        "role": "user",
        "content": [
            {
                "type": "text",
                "text": "<tool_response>\nA\n</tool_response>\n<tool_response>\nB\n</tool_response>",
            }
        ],
    }


def test_short_call_ids_get_one_stable_long_id() -> None:
    messages, _ = fit_messages(HISTORY, None, TemplateTraits(accepts_short_call_ids=False))
    call_id = messages[2]["tool_calls"][0]["id"]
    assert len(call_id) == 9 and messages[3]["tool_call_id"] == call_id
    assert HISTORY[2]["tool_calls"][0]["id"] == "c1"


# -- golden prompts ------------------------------------------------------------------------------


def text(value: str) -> pb.Part:
    return pb.Part(text=pb.TextPart(text=value))


def image() -> pb.Part:
    return pb.Part(image=pb.ImagePart(data=b"\x89PNG fake", media_type="image/png"))


GOLDEN_TOOLS = [
    pb.Tool(
        function=pb.FunctionTool(
            name="screenshot",
            description="Capture the screen",
            parameters_json=json.dumps({"type": "object", "properties": {"window": {"type": "string"}}}),
        )
    )
]
# An agent turn: system, a question with an image, a call, its output with a screenshot
# (lowered into a following user turn), and a developer note.
AGENT = lower_messages(
    [
        pb.Message(role=pb.ROLE_SYSTEM, parts=[text("You operate a desktop.")]),
        pb.Message(role=pb.ROLE_USER, parts=[text("What is on screen now? Here is the last one:"), image()]),
        pb.Message(role=pb.ROLE_ASSISTANT, parts=[text("Let me look.")]),
        pb.Message(
            role=pb.ROLE_ASSISTANT,
            tool_calls=[pb.ToolCall(id="call_7f3a9c2e1b", name="screenshot", arguments='{"window": "main"}')],
        ),
        pb.Message(
            role=pb.ROLE_TOOL,
            tool_output=pb.ToolOutput(
                call_id="call_7f3a9c2e1b", parts=pb.PartList(parts=[text("ok"), image()])
            ),
        ),
        pb.Message(role=pb.ROLE_DEVELOPER, parts=[text("Answer in one sentence.")]),
    ]
)
# A plain chat with two images and an earlier answer.
CHAT = [
    pb.Message(role=pb.ROLE_SYSTEM, parts=[text("You are terse.")]),
    pb.Message(role=pb.ROLE_USER, parts=[text("Compare"), image(), text("and"), image()]),
    pb.Message(role=pb.ROLE_ASSISTANT, parts=[text("The first is darker.")]),
    pb.Message(role=pb.ROLE_USER, parts=[text("Why?")]),
]


def _golden(name: str, kind: str, rendered: str) -> None:
    path = GOLDEN_DIR / f"{name}.{kind}.txt"
    if os.environ.get("VLMSERVE_UPDATE_GOLDEN"):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(rendered, encoding="utf-8")
    assert rendered == path.read_text(encoding="utf-8")


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_agent_conversation_renders_as_golden(name: str, tokenizers: dict[str, Any]) -> None:
    rendered = render_prompt(
        AGENT, template=tokenizers[name], tools=GOLDEN_TOOLS, tool_call_format=HERMES_FORMAT
    )
    # Every piece of the conversation reaches the prompt (nothing dropped by the template).
    for piece in ("You operate a desktop.", "What is on screen now?", "Let me look.", "screenshot", "ok"):
        assert piece in rendered.text, piece
    assert "Answer in one sentence." in rendered.text
    assert "Capture the screen" in rendered.text
    assert "'type': 'text'" not in rendered.text
    assert len(rendered.images) == 2
    _golden(name, "agent", rendered.text)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_chat_conversation_renders_as_golden(name: str, tokenizers: dict[str, Any]) -> None:
    rendered = render_prompt(CHAT, template=tokenizers[name])
    for piece in ("You are terse.", "Compare", "The first is darker.", "Why?"):
        assert piece in rendered.text, piece
    # Mistral's default system prompt carries today's date; the golden files hold none.
    _golden(name, "chat", re.sub(r"\d{4}-\d{2}-\d{2}", "YYYY-MM-DD", rendered.text))
