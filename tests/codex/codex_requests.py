"""Codex-shaped Responses requests, built from the shapes Codex CLI 0.169.0 was recorded sending.

See docs/codex-shapes.md (and `data/codex_request_turn2.json`, a real recorded body). Used
by the replay tests and by `bench/codex_prefill.py` (which pads the history to ~19k OpenAI tokens).
"""

from __future__ import annotations

import base64
import copy
import inspect
import io
import json
import uuid
from functools import cache
from pathlib import Path
from typing import Any

from PIL import Image, ImageDraw

DATA_DIR = Path(__file__).parent / "data"
RECORDED_TURN2 = DATA_DIR / "codex_request_turn2.json"
RECORDED_KNOWN_MODEL_TURN1 = DATA_DIR / "codex_request_known_model_turn1.json"

# Stdlib modules whose source stands in for files an agent `cat`s into its history (fixed per
# Python version, so padded prompts are reproducible).
_FILLER_MODULES = (
    "json.decoder",
    "textwrap",
    "shlex",
    "fnmatch",
    "glob",
    "difflib",
    "string",
    "tokenize",
    "argparse",
    "configparser",
    "dataclasses",
    "enum",
)


def load_recorded(path: Path = RECORDED_TURN2) -> dict[str, Any]:
    body: dict[str, Any] = json.loads(path.read_text())
    return body


def screenshot_png(size: tuple[int, int] = (64, 48)) -> bytes:
    """A small real PNG, drawn like a screenshot would be (not a 1x1 stub)."""
    image = Image.new("RGB", size, "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle((4, 4, size[0] // 2, size[1] // 2), fill="red")
    draw.ellipse((size[0] // 2, size[1] // 4, size[0] - 4, size[1] - 4), fill="blue")
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def data_url(png: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4()}"


def developer_message(*texts: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": _id("msg"),
        "role": "developer",
        "content": [{"type": "input_text", "text": text} for text in texts],
    }


def user_message(text: str) -> dict[str, Any]:
    return {
        "type": "message",
        "id": _id("msg"),
        "role": "user",
        "content": [{"type": "input_text", "text": text}],
    }


def function_call(call_id: str, name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    return {
        "type": "function_call",
        "status": "completed",
        "id": _id("fc"),
        "name": name,
        "arguments": json.dumps(arguments),
        "call_id": call_id,
    }


def view_image_output(call_id: str, png: bytes) -> dict[str, Any]:
    """Codex's view_image result: an image-only function_call_output with detail "high"."""
    return {
        "type": "function_call_output",
        "id": _id("fco"),
        "call_id": call_id,
        "output": [{"type": "input_image", "image_url": data_url(png), "detail": "high"}],
    }


def _function_tool(
    name: str, description: str, properties: dict[str, Any], required: list[str]
) -> dict[str, Any]:
    return {
        "type": "function",
        "name": name,
        "description": description,
        "strict": False,
        "parameters": {
            "type": "object",
            "properties": properties,
            "required": required,
            "additionalProperties": False,
        },
    }


def codex_tools() -> list[dict[str, Any]]:
    """The tool kinds Codex sends: strict-flagged functions, a namespace, hosted and client-only tools."""
    text = {"type": "string"}
    return [
        _function_tool("exec_command", "Runs a command in a PTY.", {"cmd": text, "workdir": text}, ["cmd"]),
        _function_tool(
            "view_image",
            "View a local image file from the filesystem when visual inspection is needed.",
            {"path": {"type": "string", "description": "Local filesystem path to an image file."}},
            ["path"],
        ),
        {
            "type": "namespace",
            "name": "multi_agent_v1",
            "description": "Tools for spawning and managing sub-agents.",
            "tools": [
                _function_tool("spawn_agent", "Spawn a sub-agent.", {"message": text}, ["message"]),
                _function_tool("close_agent", "Close an agent.", {"target": text}, ["target"]),
            ],
        },
        {
            "type": "custom",
            "name": "apply_patch",
            "description": "Use the `apply_patch` tool to edit files. This is a FREEFORM tool.",
            "format": {
                "type": "grammar",
                "syntax": "lark",
                "definition": 'start: "*** Begin Patch" /(.|\\n)*/',
            },
        },
        {
            "type": "tool_search",
            "execution": "client",
            "description": "Searches over deferred tool metadata.",
            "parameters": {"type": "object", "properties": {"query": text}, "required": ["query"]},
        },
        {"type": "web_search", "external_web_access": False, "search_content_types": ["text", "image"]},
    ]


def codex_view_image_turn2(
    model: str, png: bytes, prompt: str = "Describe screenshot.png."
) -> dict[str, Any]:
    """Turn 2 of a view_image round trip, with every top-level field Codex sends."""
    call_id = _id("call")
    session = str(uuid.uuid4())
    turn_metadata = json.dumps({"session_id": session, "turn_id": str(uuid.uuid4()), "padding": "x" * 600})
    return {
        "model": model,
        "stream": True,
        "input": [
            developer_message("You are a coding agent running in the Codex CLI. Be precise and concise."),
            developer_message(
                "<skills_instructions>none</skills_instructions>", "<permissions>read-only</permissions>"
            ),
            user_message("<environment_context>\n  <cwd>/home/user/project</cwd>\n</environment_context>"),
            user_message(prompt),
            function_call(call_id, "view_image", {"path": "/home/user/project/screenshot.png"}),
            view_image_output(call_id, png),
        ],
        "tools": codex_tools(),
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": session,
        "text": {"verbosity": "low"},
        # Codex sends a value longer than `metadata`'s 512-char limit here; it must be accepted.
        "client_metadata": {"session_id": session, "x-codex-turn-metadata": turn_metadata},
    }


@cache
def _filler_sources() -> tuple[str, ...]:
    import importlib

    return tuple(inspect.getsource(importlib.import_module(name)) for name in _FILLER_MODULES)


def pad_history(body: dict[str, Any], target_chars: int, chunk_chars: int = 3000) -> dict[str, Any]:
    """A copy of `body` with exec_command calls + text outputs inserted before the last user prompt
    until the input's text reaches `target_chars`, as a long agent session would."""
    padded = copy.deepcopy(body)
    items: list[dict[str, Any]] = padded["input"]
    last_user = max(i for i, item in enumerate(items) if item.get("role") == "user")
    history: list[dict[str, Any]] = []
    total = len(json.dumps(items))
    step = 0
    sources = _filler_sources()
    while total < target_chars:
        source = sources[step % len(sources)]
        start = (step // len(sources)) * chunk_chars
        text = source[start : start + chunk_chars] or source[:chunk_chars]
        call_id = f"call_pad{step}"
        call = function_call(
            call_id, "exec_command", {"cmd": f"sed -n '{start},+200p' {_FILLER_MODULES[step % len(sources)]}"}
        )
        output = {"type": "function_call_output", "id": f"fco_pad{step}", "call_id": call_id, "output": text}
        history += [call, output]
        total += len(json.dumps(call)) + len(json.dumps(output))
        step += 1
    items[last_user:last_user] = history
    return padded


def codex_headers(session: str | None = None) -> dict[str, str]:
    """The headers Codex 0.169.0 sends with every turn (values shortened)."""
    session = session or str(uuid.uuid4())
    return {
        "authorization": "Bearer dummy-key",
        "accept": "text/event-stream",
        "originator": "codex_exec",
        "user-agent": "codex_exec/0.169.0 (Debian 12.0.0; x86_64) xterm (codex_exec; 0.169.0)",
        "session-id": session,
        "thread-id": session,
        "x-client-request-id": session,
        "x-codex-window-id": f"{session}:0",
        "x-codex-beta-features": "remote_compaction_v2",
        "x-codex-turn-metadata": json.dumps({"session_id": session, "request_kind": "turn"}),
    }
