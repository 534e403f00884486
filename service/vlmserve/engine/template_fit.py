"""Fit a conversation to what a model's chat template can render, the way its authors intend.

Chat templates differ in what they accept: Gemma 3's has no system role and insists that user
and model turns alternate; Qwen2.5-VL's, SmolVLM's and LLaVA's render neither tools nor tool
calls (they would be dropped without a word); Qwen3-VL-Instruct's drops a system turn that is
not the first; Mistral's wants tool call ids of at least nine characters. Instead of a table
per family, each template is probed once with small conversations (`probe`), and `fit_messages`
rewrites only what that template cannot take:

- a first system turn becomes one text part (Gemma, Mistral and Llama 4 read only its first),
  a string where the template prints it whole (Gemma 4);
- tools a template does not render are described in the system turn as prompt text, in the
  format the registry names for that (`toolcalls/registry.py` `TEXT_TOOLS_FORMAT`, Hermes: Qwen2.5's
  ``# Tools`` block; the engine then parses ``<tool_call>`` output), and with them earlier tool
  calls become call text and tool results result text in a user turn, as Qwen2.5 renders them;
- tool turns a template refuses become that user-turn text too;
- a later system turn a template drops becomes a user turn;
- consecutive turns of one role are merged where the template requires alternation;
- tool call ids shorter than a template accepts get a stable 9-character id;
- text-only user turns are given as strings to a template that would print a part list's
  Python repr (Llama 4's, when tools are present), and an empty turn carries the tools there
  when the first user turn holds an image.

Pure: no MLX. Probing only renders text.
"""

from __future__ import annotations

import hashlib
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from jinja2 import TemplateError

from vlmserve.engine.toolcalls.registry import TEXT_TOOLS_FORMAT, ToolPrompt, tool_format

__all__ = ["ChatTemplate", "TemplateTraits", "fit_messages", "probe"]


class ChatTemplate(Protocol):
    """What renders a conversation: a transformers tokenizer or processor."""

    def apply_chat_template(self, conversation: Any, **kwargs: Any) -> Any: ...


_PROBE_TOOL = "vlmserve_probe_tool"
_PROBE_CALL = "vlmserve_probe_call"
_PROBE_RESULT = "vlmserve_probe_result"
_PROBE_SYSTEM = "vlmserve_probe_system"
_PROBE_SECOND = "vlmserve_probe_second"
_LONG_ID = "call_probe0123456789"
_SHORT_ID = "c1"


@dataclass(frozen=True, slots=True)
class TemplateTraits:
    """What a chat template renders, found by `probe`."""

    renders_tools: bool = True
    renders_tool_calls: bool = True
    renders_tool_turns: bool = True
    accepts_short_call_ids: bool = True
    renders_later_system: bool = True
    accepts_consecutive_turns: bool = True
    # Llama 4's template, given tools, prints the first user turn's content with `|trim`, which
    # turns a list of parts into its Python repr; text-only content must then be a string.
    needs_string_content_with_tools: bool = False
    # Gemma 4's template prints the first system turn's content with `|trim` too (a list of
    # parts becomes its repr): it must be a string.
    needs_string_system: bool = False


def _text(value: str) -> list[dict[str, Any]]:
    return [{"type": "text", "text": value}]


def _call(call_id: str) -> dict[str, Any]:
    return {"id": call_id, "type": "function", "function": {"name": _PROBE_CALL, "arguments": {}}}


def _renders(template: Any, messages: list[dict[str, Any]], marker: str, tools: Any = None) -> bool:
    try:
        text = template.apply_chat_template(messages, tools=tools, add_generation_prompt=True, tokenize=False)
    except (TemplateError, ValueError, TypeError, LookupError, AttributeError):
        return False
    return isinstance(text, str) and marker in text


def _probe_uncached(template: Any) -> TemplateTraits:
    user = {"role": "user", "content": _text("hello")}
    tool = {"type": "function", "function": {"name": _PROBE_TOOL, "parameters": {"type": "object"}}}

    def tool_exchange(call_id: str) -> list[dict[str, Any]]:
        return [
            user,
            {"role": "assistant", "content": [], "tool_calls": [_call(call_id)]},
            {"role": "tool", "content": _PROBE_RESULT, "tool_call_id": call_id},
        ]

    renders_tool_turns = _renders(template, tool_exchange(_LONG_ID), _PROBE_RESULT)
    return TemplateTraits(
        renders_tools=_renders(template, [user], _PROBE_TOOL, tools=[tool]),
        renders_tool_calls=_renders(
            template,
            [user, {"role": "assistant", "content": [], "tool_calls": [_call(_LONG_ID)]}, user],
            _PROBE_CALL,
        ),
        renders_tool_turns=renders_tool_turns,
        accepts_short_call_ids=not renders_tool_turns
        or _renders(template, tool_exchange(_SHORT_ID), _PROBE_RESULT),
        renders_later_system=_renders(
            template,
            [
                user,
                {"role": "assistant", "content": _text("hi")},
                {"role": "system", "content": _text(_PROBE_SYSTEM)},
                user,
            ],
            _PROBE_SYSTEM,
        ),
        accepts_consecutive_turns=_renders(
            template, [user, {"role": "user", "content": _text(_PROBE_SECOND)}], _PROBE_SECOND
        ),
        needs_string_content_with_tools=_renders(template, [user], "'type': 'text'", tools=[tool]),
        needs_string_system=_renders(
            template, [{"role": "system", "content": _text(_PROBE_SYSTEM)}, user], "'type': 'text'"
        ),
    )


_cache: dict[tuple[int, str], TemplateTraits] = {}
_cache_lock = threading.Lock()


def probe(template: Any) -> TemplateTraits:
    """The traits of a tokenizer's (or processor's) chat template; computed once per template."""
    key = (id(template), str(getattr(template, "chat_template", "")))
    with _cache_lock:
        known = _cache.get(key)
    if known is None:
        known = _probe_uncached(template)
        with _cache_lock:
            _cache[key] = known
    return known


def _text_tools_prompt() -> ToolPrompt:
    prompt = tool_format(TEXT_TOOLS_FORMAT).prompt
    assert prompt is not None, "the registry's text-tools format writes its tools as prompt text"
    return prompt


def _joined_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    return "".join(part.get("text", "") for part in content if part.get("type") == "text")


def _text_only(content: Any) -> bool:
    return isinstance(content, str) or all(part.get("type") == "text" for part in content)


def _short_id(call_id: str) -> str:
    return hashlib.sha256(call_id.encode()).hexdigest()[:9]


def fit_messages(
    messages: list[dict[str, Any]],
    tools: list[dict[str, Any]] | None,
    traits: TemplateTraits,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None]:
    """(messages, tools) rewritten to what the template renders (see the module docstring)."""
    fitted = [dict(message) for message in messages]
    prompt = _text_tools_prompt()
    tools_as_text = bool(tools) and not traits.renders_tools
    if fitted and fitted[0]["role"] == "system":
        fitted[0]["content"] = _text(_joined_text(fitted[0]["content"]))
    if tools_as_text:
        assert tools is not None
        block = prompt.tools_block(tools)
        if fitted and fitted[0]["role"] == "system":
            system = _joined_text(fitted[0]["content"])
            fitted[0]["content"] = _text(f"{system}\n\n{block}" if system else block)
        else:
            fitted.insert(0, {"role": "system", "content": _text(block)})
        tools = None
    calls_as_text = tools_as_text or not traits.renders_tool_calls
    results_as_text = tools_as_text or calls_as_text or not traits.renders_tool_turns
    converted: list[dict[str, Any]] = []
    for index, message in enumerate(fitted):
        role = message["role"]
        if role == "assistant" and message.get("tool_calls") and calls_as_text:
            text = _joined_text(message["content"])
            calls = "\n".join(prompt.call(call) for call in message["tool_calls"])
            message = {
                **{key: value for key, value in message.items() if key == "reasoning_content"},
                "role": "assistant",
                "content": _text(f"{text}\n{calls}" if text else calls),
            }
        elif role == "tool" and results_as_text:
            message = {
                "role": "user",
                "content": _text(prompt.result(message["content"])),
            }
            if converted and converted[-1].get("tool_result"):
                previous = converted.pop()
                message["content"] = _text(
                    _joined_text(previous["content"]) + "\n" + _joined_text(message["content"])
                )
            message["tool_result"] = True
        elif role == "system" and index > 0 and not traits.renders_later_system:
            message = {"role": "user", "content": message["content"]}
        converted.append(message)
    for message in converted:
        message.pop("tool_result", None)
    if traits.needs_string_system and converted and converted[0]["role"] == "system":
        converted[0]["content"] = _joined_text(converted[0]["content"])
    if tools and traits.needs_string_content_with_tools:
        first = 1 if converted and converted[0]["role"] == "system" else 0
        if first < len(converted) and not _text_only(converted[first]["content"]):
            # The template prints the tools and this turn's content as one string: give it an
            # empty text turn to hold the tools, so the images stay in a turn of their own.
            converted.insert(first, {"role": "user", "content": ""})
        for message in converted:
            content = message["content"]
            if message["role"] == "user" and isinstance(content, list) and _text_only(content):
                message["content"] = _joined_text(content)
    if not traits.accepts_short_call_ids:
        _lengthen_call_ids(converted)
    if not traits.accepts_consecutive_turns:
        converted = _merge_consecutive(converted)
    return converted, tools


def _lengthen_call_ids(messages: list[dict[str, Any]]) -> None:
    for message in messages:
        if message.get("tool_calls"):
            message["tool_calls"] = [dict(call) for call in message["tool_calls"]]  # not the caller's
        for call in message.get("tool_calls") or ():
            if len(call.get("id") or "") < 9:
                call["id"] = _short_id(call.get("id") or "")
        if message["role"] == "tool" and len(message.get("tool_call_id") or "") < 9:
            message["tool_call_id"] = _short_id(message.get("tool_call_id") or "")


def _merge_consecutive(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    merged: list[dict[str, Any]] = []
    for message in messages:
        previous = merged[-1] if merged else None
        if (
            previous is not None
            and previous["role"] == message["role"]
            and message["role"] in ("user", "assistant")
            and not previous.get("tool_calls")
            and not message.get("tool_calls")
        ):
            previous["content"] = [*previous["content"], *_text("\n\n"), *message["content"]]
        else:
            merged.append(dict(message))
    return merged
