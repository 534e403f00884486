"""GLM-4.5V / 4.6V (`glm4v`, `glm4v_moe`): what its row in docs/models.md claims beyond the
per-family tests (test_families.py and the others run it as every row) — its reasoning and its
tool calls as the model writes them, and its thinking switch.

GLM's generation prompt ends at `<|assistant|>`: the model opens `\\n<think>` itself, closes it,
then answers or calls a tool in the `<tool_call>NAME` + `<arg_key>`/`<arg_value>` form."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import llguidance
import pytest
from transformers import AutoTokenizer

from tests._family_models import family_models  # noqa: F401  (fixture)
from vlmserve.engine.grammar.compiler import GrammarCompiler, after_thinking, constraint_for
from vlmserve.engine.output.assembler import OutputAssembler
from vlmserve.engine.prep.prompt import render_prompt
from vlmserve.engine.v1 import engine_pb2 as pb

from ._family_engine import greedy, running_engine, text, user

TOOLS = [{"type": "function", "function": {"name": "click", "parameters": {"type": "object"}}}]
CALL = "<tool_call>click\n<arg_key>x</arg_key>\n<arg_value>120</arg_value>\n</tool_call>"


@pytest.mark.parametrize(
    ("chunks", "reasoning", "visible", "calls"),
    [
        (
            ["\n<think>The button is top left.</think>\nIt is the OK button."],
            "The button is top left.",
            "It is the OK button.",
            [],
        ),
        # Streamed in pieces that split the markers.
        (["\n<th", "ink>Look first.</thi", "nk>\n", CALL], "Look first.", "", [("click", {"x": 120})]),
        # Thinking off (`enable_thinking` false): the prompt closed an empty block, plain answer.
        (["Done."], "", "Done.", []),
    ],
)
def test_glm_output_splits_into_reasoning_text_and_calls(
    chunks: list[str], reasoning: str, visible: str, calls: list[tuple[str, object]]
) -> None:
    assembler = OutputAssembler(stop=[], tool_call_format="glm47", tools=TOOLS)
    for chunk in chunks:
        assembler.feed(chunk)
    assembler.finish()
    assert "".join(assembler.reasoning) == reasoning
    assert "".join(assembler.text).strip() == visible
    assert [(call.name, json.loads(call.arguments)) for call in assembler.tool_calls] == calls


@pytest.mark.needs_model
def test_the_thinking_switch_and_a_replayed_thought(family_models: dict[str, Path]) -> None:  # noqa: F811
    """The engine reports GLM's template as thinking; `enable_thinking: false` reaches it (its
    `/nothink` and closed empty block: the prompt is the template's own); a thought replayed in
    the turn after the last user turn (an agent's tool loop) is rendered, as the template does."""
    model = family_models["glm4v"]
    tokenizer: Any = AutoTokenizer.from_pretrained(str(model))
    question = "Where is the OK button?"
    with running_engine(model) as (_, stub):
        info = stub.GetModelInfo(pb.GetModelInfoRequest(), timeout=10)
        assert (info.thinking, info.tool_call_format) == (True, "glm47")
        for switch in (None, False):
            request = greedy([user(text(question))], max_tokens=4)
            if switch is not None:
                request.enable_thinking = switch
            counted = stub.CountTokens(pb.CountTokensRequest(request=request), timeout=60).input_tokens
            expected = tokenizer.apply_chat_template(
                [{"role": "user", "content": question}],
                add_generation_prompt=True,
                tokenize=False,
                **({} if switch is None else {"enable_thinking": switch}),
            )
            assert counted == len(tokenizer.encode(expected, add_special_tokens=False)), switch
    assert expected.endswith(question + "/nothink<|assistant|>\n<think></think>")
    replayed = render_prompt(
        [
            user(text(question)),
            pb.Message(
                role=pb.ROLE_ASSISTANT,
                reasoning_text="Take a screenshot first.",
                tool_calls=[pb.ToolCall(id="call_1", name="click", arguments='{"x": 120}')],
            ),
            pb.Message(
                role=pb.ROLE_TOOL,
                tool_output=pb.ToolOutput(call_id="call_1", parts=pb.PartList(parts=[text("ok")])),
            ),
        ],
        template=tokenizer,
        tools=[pb.Tool(function=pb.FunctionTool(name="click", parameters_json='{"type": "object"}'))],
        tool_call_format="glm47",
    )
    assert (
        "<|assistant|>\n<think>Take a screenshot first.</think>\n<tool_call>click\n<arg_key>x</arg_key>"
        in replayed.text
    )
    assert replayed.text.endswith("<|observation|>\n<tool_response>\nok\n</tool_response><|assistant|>")


PROMPT = "[gMASK]<sop><|user|>\nClick OK.<|assistant|>"
CLICK = pb.Tool(
    function=pb.FunctionTool(
        name="click",
        parameters_json='{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}',
        strict=True,
    )
)


@pytest.mark.needs_model
@pytest.mark.parametrize(
    ("mode", "prompt_end", "output", "allowed"),
    [
        # Tools offered (auto, an agent's default): the model may think, then answer or call.
        ("auto", "", "\n<think>OK is at the top.</think>\nIt is there.", True),
        ("auto", "", "\n<think>Click it.\nNow.</think>\n" + CALL, True),
        ("auto", "", "It is there.", True),
        # A forced call: one thought at most, then the call; never text.
        ("required", "", "\n<think>Click it.</think>\n" + CALL, True),
        ("required", "", CALL, True),
        ("required", "", "\n<think>Click it.</think>\nNo.", False),
        ("required", "", "<think>a</think><think>b</think>" + CALL, False),
        # Thinking off: the prompt closed an empty block, no other thought.
        ("required", "\n<think></think>", "\n<think>Click it.</think>\n" + CALL, False),
        ("required", "\n<think></think>", CALL, True),
    ],
)
def test_the_grammar_lets_glm_think_before_it_answers(
    family_models: dict[str, Path],  # noqa: F811
    mode: str,
    prompt_end: str,
    output: str,
    allowed: bool,
) -> None:
    """GLM opens `<think>` itself, and `<think>` is an added token no text terminal matches: with
    tools offered the grammar refused it, so the model could not think at all in an agent loop."""
    tokenizer: Any = AutoTokenizer.from_pretrained(str(family_models["glm4v"]))
    compiler = GrammarCompiler(tokenizer, [tokenizer.convert_tokens_to_ids("<|user|>")])
    constraint = constraint_for(
        compiler,
        tool_call_format="glm47",
        tools=[CLICK],
        tool_mode=mode,
        forced_name=None,
        parallel_tool_calls=True,
        max_tool_calls=None,
        response_format=None,
    )
    assert constraint is not None
    constraint = after_thinking(constraint, compiler, PROMPT + prompt_end, model_thinks=True)
    matcher = llguidance.LLMatcher(compiler.tokenizer, constraint.grammar)
    accepted = all(matcher.consume_token(t) for t in tokenizer.encode(output, add_special_tokens=False))
    assert (accepted and matcher.is_accepting()) is allowed
