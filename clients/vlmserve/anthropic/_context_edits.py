"""Anthropic `context_management.edits`, applied to a Messages body before it is translated.

- `clear_tool_uses_20250919`: once the prompt reaches `trigger` input tokens (default 100,000),
  the results of all but the last `keep` tool uses (default 3) are replaced by a placeholder,
  oldest first, leaving the tools named in `exclude_tools` alone; `clear_tool_inputs` (true, or
  a list of tool names) clears those calls' inputs too. With `clear_at_least`, the edit applies
  only if it clears at least that many tokens.
- `clear_thinking_20251015`: the thinking of all but the last `keep` assistant turns that have
  some (`{"type": "thinking_turns", "value": N}`, default 1; `"all"` keeps every one) is left out.
- `compact_20260112`: past its trigger the facade summarises first (routes/anthropic.py) and
  answers on `compacted_body`; its `compaction` blocks replayed in a later request: everything
  before the latest one is left out, the block reaches the model as an assistant turn with its
  summary (a block with `content: null`, a failed compaction, is a no-op).

What was applied is reported as Anthropic does, in the response's `context_management`:
`{"applied_edits": [{"type", "cleared_tool_uses" | "cleared_thinking_turns", "cleared_input_tokens"}]}`.
Cleared tokens are estimated (a token per 4 characters, `IMAGE_TOKENS` per image): counting each
cleared block with the engine would cost a request each.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from vlmserve.responses import InvalidRequestError

CLEAR_TOOL_USES = "clear_tool_uses_20250919"
CLEAR_THINKING = "clear_thinking_20251015"
COMPACT = "compact_20260112"
EDIT_TYPES = (CLEAR_TOOL_USES, CLEAR_THINKING, COMPACT)
CLEARED_RESULT = "[Tool result cleared to save context]"
SUMMARY_HEADING = "Summary of the conversation so far:\n"
IMAGE_TOKENS = 800
_CHARS_PER_TOKEN = 4


@dataclass(frozen=True)
class ClearToolUses:
    trigger: int = 100_000
    keep: int = 3
    clear_at_least: int = 0
    exclude_tools: frozenset[str] = frozenset()
    # True: every cleared call's input; a set: those tools' calls' inputs.
    clear_tool_inputs: bool | frozenset[str] = False


@dataclass(frozen=True)
class ClearThinking:
    # None: keep all.
    keep: int | None = 1


@dataclass(frozen=True)
class Compact:
    trigger: int = 150_000
    pause_after_compaction: bool = False
    instructions: str | None = None


Edit = ClearToolUses | ClearThinking | Compact


@dataclass
class EditedBody:
    body: dict[str, Any]
    applied: list[dict[str, Any]] = field(default_factory=list)


def _refuse(param: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid value for '{param}': {message}", param=param, code="invalid_value")


def _amount(value: Any, kind: str, param: str) -> int:
    if not isinstance(value, dict) or value.get("type") != kind or type(value.get("value")) is not int:
        raise _refuse(param, f'expected {{"type": "{kind}", "value": <integer>}}.')
    if value["value"] < 0:
        raise _refuse(f"{param}.value", "must be 0 or more.")
    return int(value["value"])


def _names(value: Any, param: str) -> frozenset[str]:
    if not isinstance(value, list) or not all(isinstance(name, str) for name in value):
        raise _refuse(param, "expected an array of tool names.")
    return frozenset(value)


def parse_edits(context_management: Any) -> list[Edit]:
    """The edits of a `context_management` value (400s naming the field)."""
    if context_management is None:
        return []
    param = "context_management"
    if not isinstance(context_management, dict):
        raise _refuse(param, "expected an object with 'edits'.")
    unknown = sorted(set(context_management) - {"edits"})
    if unknown:
        raise _refuse(f"{param}.{unknown[0]}", "unknown field.")
    edits = context_management.get("edits", [])
    if not isinstance(edits, list):
        raise _refuse(f"{param}.edits", "expected an array of edits.")
    parsed: list[Edit] = []
    for index, edit in enumerate(edits):
        at = f"{param}.edits[{index}]"
        kind = edit.get("type") if isinstance(edit, dict) else None
        if kind not in EDIT_TYPES:
            raise _refuse(f"{at}.type", "supported edits: " + ", ".join(EDIT_TYPES) + ".")
        assert isinstance(edit, dict)
        allowed = {
            CLEAR_TOOL_USES: {
                "type",
                "trigger",
                "keep",
                "clear_at_least",
                "exclude_tools",
                "clear_tool_inputs",
            },
            CLEAR_THINKING: {"type", "keep"},
            COMPACT: {"type", "trigger", "pause_after_compaction", "instructions"},
        }[kind]
        extra = sorted(set(edit) - allowed)
        if extra:
            raise _refuse(f"{at}.{extra[0]}", f"unknown field of a {kind} edit.")
        if kind == CLEAR_TOOL_USES:
            inputs = edit.get("clear_tool_inputs", False)
            parsed.append(
                ClearToolUses(
                    trigger=_amount(edit["trigger"], "input_tokens", f"{at}.trigger")
                    if "trigger" in edit
                    else 100_000,
                    keep=_amount(edit["keep"], "tool_uses", f"{at}.keep") if "keep" in edit else 3,
                    clear_at_least=_amount(edit["clear_at_least"], "input_tokens", f"{at}.clear_at_least")
                    if edit.get("clear_at_least") is not None
                    else 0,
                    exclude_tools=_names(edit.get("exclude_tools", []), f"{at}.exclude_tools"),
                    clear_tool_inputs=inputs
                    if isinstance(inputs, bool)
                    else _names(inputs, f"{at}.clear_tool_inputs"),
                )
            )
        elif kind == CLEAR_THINKING:
            keep = edit.get("keep", {"type": "thinking_turns", "value": 1})
            parsed.append(
                ClearThinking(None if keep == "all" else _amount(keep, "thinking_turns", f"{at}.keep"))
            )
        else:
            instructions = edit.get("instructions")
            if instructions is not None and not isinstance(instructions, str):
                raise _refuse(f"{at}.instructions", "expected a string.")
            pause = edit.get("pause_after_compaction", False)
            if not isinstance(pause, bool):
                raise _refuse(f"{at}.pause_after_compaction", "expected a boolean.")
            trigger = (
                _amount(edit["trigger"], "input_tokens", f"{at}.trigger") if "trigger" in edit else 150_000
            )
            parsed.append(Compact(trigger, pause, instructions))
    return parsed


def needs_count(edits: Sequence[Edit]) -> bool:
    """Whether applying these needs the prompt's size (a trigger)."""
    return any(isinstance(edit, ClearToolUses | Compact) for edit in edits)


def apply_edits(body: dict[str, Any], edits: Sequence[Edit], input_tokens: int | None = None) -> EditedBody:
    """The body with the edits applied (a copy; `context_management` taken out), and what was."""
    edited = copy.deepcopy({key: value for key, value in body.items() if key != "context_management"})
    messages = edited.get("messages")
    if not isinstance(messages, list):
        return EditedBody(edited)
    result = EditedBody(edited)
    edited["messages"] = _after_latest_compaction(messages)
    for edit in edits:
        if isinstance(edit, ClearThinking):
            cleared = _clear_thinking(edited["messages"], edit)
            if cleared["cleared_thinking_turns"]:
                result.applied.append(cleared)
        elif isinstance(edit, ClearToolUses) and input_tokens is not None and input_tokens >= edit.trigger:
            applied = _clear_tool_uses(edited["messages"], edit)
            if applied is not None:
                result.applied.append(applied)
    return result


def _blocks(message: Any) -> list[Any]:
    content = message.get("content") if isinstance(message, dict) else None
    return content if isinstance(content, list) else []


def _estimate(value: Any) -> int:
    """Tokens a block's content takes, estimated."""
    if isinstance(value, str):
        return len(value) // _CHARS_PER_TOKEN
    if isinstance(value, list):
        return sum(_estimate(part) for part in value)
    if isinstance(value, dict):
        if value.get("type") == "image":
            return IMAGE_TOKENS
        return sum(_estimate(part) for key, part in value.items() if key not in ("type", "id", "tool_use_id"))
    return 0


def _clear_thinking(messages: list[Any], edit: ClearThinking) -> dict[str, Any]:
    thinking = ("thinking", "redacted_thinking")
    turns = [
        index
        for index, message in enumerate(messages)
        if isinstance(message, dict)
        and message.get("role") == "assistant"
        and any(isinstance(block, dict) and block.get("type") in thinking for block in _blocks(message))
    ]
    cleared_turns = cleared_tokens = 0
    older = turns if edit.keep is None or edit.keep == 0 else turns[: -edit.keep]
    for index in [] if edit.keep is None else older:
        blocks = _blocks(messages[index])
        kept = [block for block in blocks if not (isinstance(block, dict) and block.get("type") in thinking)]
        if not kept:
            continue  # a turn of thinking alone stays: an empty assistant turn is no turn
        cleared_tokens += sum(_estimate(block.get("thinking", "")) for block in blocks if block not in kept)
        messages[index] = {**messages[index], "content": kept}
        cleared_turns += 1
    return {
        "type": CLEAR_THINKING,
        "cleared_thinking_turns": cleared_turns,
        "cleared_input_tokens": cleared_tokens,
    }


def _clear_tool_uses(messages: list[Any], edit: ClearToolUses) -> dict[str, Any] | None:
    uses: list[tuple[int, int, dict[str, Any]]] = []
    results: dict[str, tuple[int, int]] = {}
    for m_index, message in enumerate(messages):
        for b_index, block in enumerate(_blocks(message)):
            if not isinstance(block, dict):
                continue
            if block.get("type") == "tool_use" and message.get("role") == "assistant":
                uses.append((m_index, b_index, block))
            elif block.get("type") == "tool_result" and isinstance(block.get("tool_use_id"), str):
                results[block["tool_use_id"]] = (m_index, b_index)
    older = uses[: len(uses) - edit.keep] if edit.keep else uses
    plan: list[tuple[dict[str, Any], tuple[int, int] | None, bool]] = []
    cleared_tokens = 0
    for _, _, use in older:
        name = use.get("name")
        if name in edit.exclude_tools:
            continue
        where = results.get(str(use.get("id")))
        clear_input = edit.clear_tool_inputs is True or (
            isinstance(edit.clear_tool_inputs, frozenset) and name in edit.clear_tool_inputs
        )
        result = messages[where[0]]["content"][where[1]] if where is not None else None
        if (
            result is not None
            and result.get("content") == CLEARED_RESULT
            and (not clear_input or use.get("input") == {})
        ):
            continue  # cleared by an earlier turn already
        cleared_tokens += _estimate(result.get("content", "")) if result is not None else 0
        if clear_input:
            cleared_tokens += _estimate(json.dumps(use.get("input", {})))
        plan.append((use, where, clear_input))
    if not plan or cleared_tokens < edit.clear_at_least:
        return None
    for use, where, clear_input in plan:
        if where is not None:
            m_index, b_index = where
            content = list(messages[m_index]["content"])
            content[b_index] = {**content[b_index], "content": CLEARED_RESULT}
            messages[m_index] = {**messages[m_index], "content": content}
        if clear_input:
            use["input"] = {}
    return {"type": CLEAR_TOOL_USES, "cleared_tool_uses": len(plan), "cleared_input_tokens": cleared_tokens}


def _after_latest_compaction(messages: list[Any]) -> list[Any]:
    """A replayed `compaction` block covers everything before it: from there on, the block as an
    assistant text turn with its summary."""
    for m_index in range(len(messages) - 1, -1, -1):
        blocks = _blocks(messages[m_index])
        for b_index in range(len(blocks) - 1, -1, -1):
            block = blocks[b_index]
            if isinstance(block, dict) and block.get("type") == "compaction":
                summary = block.get("content")
                if summary is None:
                    # A failed compaction: a no-op, as Anthropic treats it.
                    rest = [*blocks[:b_index], *blocks[b_index + 1 :]]
                    kept = [{**messages[m_index], "content": rest}] if rest else []
                    return _after_latest_compaction([*messages[:m_index], *kept, *messages[m_index + 1 :]])
                if not isinstance(summary, str):
                    raise _refuse(
                        f"messages[{m_index}].content[{b_index}].content",
                        "a compaction block's content is its summary text.",
                    )
                rest = [{"type": "text", "text": SUMMARY_HEADING + summary}, *blocks[b_index + 1 :]]
                return [{**messages[m_index], "content": rest}, *messages[m_index + 1 :]]
    return messages


def compact_edit(edits: Sequence[Edit]) -> Compact | None:
    return next((edit for edit in edits if isinstance(edit, Compact)), None)


def compaction_block(summary: str) -> dict[str, Any]:
    return {"type": "compaction", "content": summary}


def compacted_body(body: dict[str, Any], summary: str) -> dict[str, Any]:
    """The body answered after a compaction: the compaction block as the assistant's turn, then
    the last user message and what follows it (`apply_edits` expands the block)."""
    messages = body["messages"]
    last_user = next(
        (
            i
            for i in range(len(messages) - 1, -1, -1)
            if isinstance(messages[i], dict) and messages[i].get("role") == "user"
        ),
        len(messages),
    )
    block = {"role": "assistant", "content": [compaction_block(summary)]}
    return {**body, "messages": [block, *messages[last_user:]]}
