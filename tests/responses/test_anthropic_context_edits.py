"""Anthropic `context_management.edits` applied to a Messages body (pure; the facade's wire test
is tests/facade/test_anthropic_context_management.py)."""

from __future__ import annotations

from typing import Any

import pytest

from vlmserve.anthropic import apply_edits, parse_edits
from vlmserve.anthropic._context_edits import CLEARED_RESULT, ClearThinking, ClearToolUses
from vlmserve.responses import InvalidRequestError


def use(n: int, name: str = "Read") -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [{"type": "tool_use", "id": f"t{n}", "name": name, "input": {"n": n}}],
    }


def result(n: int) -> dict[str, Any]:
    return {
        "role": "user",
        "content": [{"type": "tool_result", "tool_use_id": f"t{n}", "content": "x" * 400}],
    }


def loop(names: list[str]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = [{"role": "user", "content": "go"}]
    for n, name in enumerate(names):
        messages += [use(n, name), result(n)]
    return messages


def contents(messages: list[dict[str, Any]]) -> list[Any]:
    return [
        b.get("content")
        for m in messages
        if isinstance(m["content"], list)
        for b in m["content"]
        if b["type"] == "tool_result"
    ]


def test_older_tool_results_go_past_the_trigger() -> None:
    body = {"messages": loop(["Read"] * 5), "context_management": {"edits": []}}
    edits = parse_edits(
        {
            "edits": [
                {
                    "type": "clear_tool_uses_20250919",
                    "trigger": {"type": "input_tokens", "value": 1000},
                    "keep": {"type": "tool_uses", "value": 2},
                }
            ]
        }
    )
    assert apply_edits(body, edits, input_tokens=999).applied == []
    edited = apply_edits(body, edits, input_tokens=1000)
    assert edited.applied == [
        {"type": "clear_tool_uses_20250919", "cleared_tool_uses": 3, "cleared_input_tokens": 300}
    ]
    assert contents(edited.body["messages"]) == [CLEARED_RESULT] * 3 + ["x" * 400] * 2
    assert "context_management" not in edited.body
    # The inputs stay unless asked for; the client's body is not changed.
    assert edited.body["messages"][1]["content"][0]["input"] == {"n": 0}
    assert contents(body["messages"]) == ["x" * 400] * 5


def test_excluded_tools_inputs_and_clear_at_least() -> None:
    body = {"messages": loop(["Read", "Bash", "Read", "Read"])}
    edit = ClearToolUses(
        trigger=0, keep=1, exclude_tools=frozenset({"Bash"}), clear_tool_inputs=frozenset({"Read"})
    )
    edited = apply_edits(body, [edit], input_tokens=5)
    assert contents(edited.body["messages"]) == [CLEARED_RESULT, "x" * 400, CLEARED_RESULT, "x" * 400]
    assert [m["content"][0].get("input") for m in edited.body["messages"][1::2]] == [
        {},
        {"n": 1},
        {},
        {"n": 3},
    ]
    # Not worth it: fewer tokens than clear_at_least would go, so nothing does.
    stingy = ClearToolUses(trigger=0, keep=1, clear_at_least=10_000)
    assert apply_edits(body, [stingy], input_tokens=5).applied == []


def thinking_turn(n: int) -> dict[str, Any]:
    return {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "t" * 40, "signature": "s"},
            {"type": "text", "text": f"a{n}"},
        ],
    }


@pytest.mark.parametrize(
    ("keep", "cleared"),
    [(ClearThinking(1), 2), (ClearThinking(3), 0), (ClearThinking(None), 0), (ClearThinking(0), 3)],
)
def test_thinking_of_older_turns_goes(keep: ClearThinking, cleared: int) -> None:
    messages: list[dict[str, Any]] = []
    for n in range(3):
        messages += [{"role": "user", "content": f"q{n}"}, thinking_turn(n)]
    edited = apply_edits({"messages": messages}, [keep])
    kinds = [[b["type"] for b in m["content"]] for m in edited.body["messages"] if m["role"] == "assistant"]
    assert sum(kind == ["text"] for kind in kinds) == cleared
    assert edited.applied == (
        [
            {
                "type": "clear_thinking_20251015",
                "cleared_thinking_turns": cleared,
                "cleared_input_tokens": 10 * cleared,
            }
        ]
        if cleared
        else []
    )


def test_a_replayed_compaction_block_covers_what_came_before() -> None:
    messages = [
        {"role": "user", "content": "old"},
        {
            "role": "assistant",
            "content": [{"type": "compaction", "content": "Goal: squares."}, {"type": "text", "text": "ok"}],
        },
        {"role": "user", "content": "next"},
    ]
    edited = apply_edits({"messages": messages}, [])
    assert edited.body["messages"] == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Summary of the conversation so far:\nGoal: squares."},
                {"type": "text", "text": "ok"},
            ],
        },
        {"role": "user", "content": "next"},
    ]


@pytest.mark.parametrize(
    ("value", "param"),
    [
        ({"edits": [{"type": "clear_everything"}]}, "context_management.edits[0].type"),
        ({"edits": [{"type": "clear_tool_uses_20250919", "keep": 3}]}, "context_management.edits[0].keep"),
        (
            {"edits": [{"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": -1}}]},
            "context_management.edits[0].keep.value",
        ),
        ({"edits": [{"type": "clear_tool_uses_20250919", "bogus": 1}]}, "context_management.edits[0].bogus"),
        ({"edit": []}, "context_management.edit"),
    ],
)
def test_bad_edits_are_refused_naming_the_field(value: Any, param: str) -> None:
    with pytest.raises(InvalidRequestError) as refused:
        parse_edits(value)
    assert refused.value.param == param
