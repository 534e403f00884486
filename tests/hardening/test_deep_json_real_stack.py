"""Issue 13.6 on the real stack: JSON nested thousands of levels inside a function call's arguments
was a 502 (the engine let a RecursionError escape as UNKNOWN with its text). Now the engine names
the field (BadRequest) and the facade answers 400 with `param`."""

from __future__ import annotations

import httpx
import pytest


def body(arguments: str) -> dict[str, object]:
    return {
        "model": "default",
        "max_output_tokens": 4,
        "input": [
            {"role": "user", "content": "list the files"},
            {"type": "function_call", "call_id": "c1", "name": "shell", "arguments": arguments},
            {"type": "function_call_output", "call_id": "c1", "output": "a.txt"},
        ],
        "tools": [{"type": "function", "name": "shell", "parameters": {"type": "object"}}],
    }


@pytest.mark.parametrize("depth", [900, 5_000, 50_000])
def test_deeply_nested_call_arguments_are_a_400_naming_the_input(facade_url: str, depth: int) -> None:
    arguments = "[" * depth + "]" * depth
    reply = httpx.post(f"{facade_url}/v1/responses", json=body(arguments), timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["param"] == "input"
    assert "tool_calls[0].arguments is nested more than 100 levels deep" in error["message"]
    assert "ecursion" not in error["message"]


def test_arguments_at_a_sane_depth_still_work(facade_url: str) -> None:
    arguments = '{"a": ' * 50 + "1" + "}" * 50
    reply = httpx.post(f"{facade_url}/v1/responses", json=body(arguments), timeout=60)
    assert reply.status_code == 200, reply.text
