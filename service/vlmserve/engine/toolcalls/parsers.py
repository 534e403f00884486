"""Streaming tool-call parsers, one kind per model family (the registry, toolcalls/registry.py,
says which family gets which).

A parser turns the model's raw text, fed in arbitrary pieces, into visible text and whole tool
calls. Markup is never emitted as text: a possible start tag at the end of the input is held
back until it is decided, and a call is emitted once, complete, when its end tag arrives.
Work is linear in the input (each character is scanned a bounded number of times) and a call
body is bounded; an over-long call is given back as its text, without its markup, so nothing is dropped.

Hostile output (issue 39): an end tag inside an argument (`</tool_call>` in a JSON string, a
quote or `<arg_value>` left open) does not end the call when its body is not a whole call there:
a later end tag may (at most 16 tried); if none does, the call ends at the last end tag before
another call starts. A malformed call (its markup around a body that is no call) is reported as
a call when it names one (Hermes: its arguments as written, as OpenAI reports arguments that are
not JSON), else as its text with the format's markup taken out: markup is never visible text.

The body of a call is decoded by that family's mlx-vlm parser
(`parse_tool_call`: mistral, gemma4, pythonic, glm47, qwen3_coder, kimi_k2, harmony, ...).
mlx-vlm's extractor works on the finished text only and drops a call it cannot parse (a log
line), so the streaming and the keep-it-as-text rule are ours (`MarkupToolCallParser`).
Hermes / Qwen `<tool_call>{json}</tool_call>` (mlx-vlm's `json_tools`) keeps our own body
decoder: json_tools is `json.loads` and needs `name` and `arguments`, while Qwen-family models
also write `parameters` and double-encoded argument strings.
"""

from __future__ import annotations

import json
import re
import secrets
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = [
    "DEFAULT_MAX_CALL_CHARS",
    "LLAMA_PYTHON_END",
    "LLAMA_PYTHON_START",
    "HermesToolCallParser",
    "LlamaJsonToolCallParser",
    "MarkupToolCallParser",
    "ParsedToolCall",
    "PlainTextParser",
    "TextPiece",
    "ToolCallDeltaPiece",
    "ToolCallParser",
    "ToolCallPiece",
    "module_body_parser",
]

LLAMA_PYTHON_START, LLAMA_PYTHON_END = "<|python_start|>", "<|python_end|>"
DEFAULT_MAX_CALL_CHARS = 1 << 20  # a call body (e.g. a whole patch) may be large, but not unbounded
# End tags tried as a call's end before its first one is taken (each try parses the body).
_MAX_END_TAGS_TRIED = 16


@dataclass(frozen=True, slots=True)
class ParsedToolCall:
    id: str
    name: str
    # JSON text of the arguments object.
    arguments: str


@dataclass(frozen=True, slots=True)
class TextPiece:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallPiece:
    call: ParsedToolCall


@dataclass(frozen=True, slots=True)
class ToolCallDeltaPiece:
    """A call being written: its first delta names it, later ones add argument text. The call
    itself follows as a `ToolCallPiece` with the same id and these arguments joined."""

    id: str
    name: str
    arguments: str


Piece = TextPiece | ToolCallPiece | ToolCallDeltaPiece


class ToolCallParser(Protocol):
    def feed(self, text: str) -> list[Piece]:
        """Consume more raw model text; return what can be decided now, in order."""
        ...

    def finish(self) -> list[Piece]:
        """The model stopped: give back anything held. A call the output ended inside of (the
        token limit) is never text: it stays the call its deltas began, unfinished."""
        ...


def module_body_parser(parse: Callable[..., Any], tools: list[dict[str, Any]] | None) -> BodyParser:
    """mlx-vlm's `parse_tool_call(text, tools)` -> ours: calls, or None when it is not a call."""

    def parse_body(body: str) -> list[ParsedToolCall] | None:
        try:
            parsed = parse(body, tools)
        except Exception:  # each family raises its own kinds; any failure means "not a call"
            return None
        calls: list[ParsedToolCall] = []
        for entry in parsed if isinstance(parsed, list) else [parsed]:
            name = entry.get("name") if isinstance(entry, dict) else None
            # Some parsers never fail (GLM's reads any text as `first_word {"raw": rest}`): a
            # name that no function could have is not a call.
            if not isinstance(name, str) or not _FUNCTION_NAME.fullmatch(name.strip()):
                return None
            arguments = entry.get("arguments", {})
            if _is_raw_fallback(body, arguments):
                return None
            text = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
            calls.append(ParsedToolCall(id=new_call_id(), name=name.strip(), arguments=text))
        return calls or None

    return parse_body


# Function names as OpenAI allows them, with the namespaces and ids some formats keep.
_FUNCTION_NAME = re.compile(r"[A-Za-z0-9_][\w.:-]*")


def _is_raw_fallback(body: str, arguments: Any) -> bool:
    """GLM's parser read free text after a name as `{"raw": ...}`: not a call's arguments."""
    return (
        isinstance(arguments, dict)
        and list(arguments) == ["raw"]
        and "<arg_key>" not in body
        and not body.rstrip().endswith("}")
    )


def new_call_id() -> str:
    return f"call_{secrets.token_hex(12)}"


class PlainTextParser:
    """No tool calls: every piece of text is visible text."""

    def feed(self, text: str) -> list[Piece]:
        return [TextPiece(text)] if text else []

    def finish(self) -> list[Piece]:
        return []


def _held_prefix_length(buffer: str, tag: str) -> int:
    """Length of the longest suffix of `buffer` that is a proper prefix of `tag`."""
    if buffer.find(tag[0], max(0, len(buffer) - len(tag) + 1)) < 0:
        return 0  # the common case, decided by one bounded search
    for length in range(min(len(tag) - 1, len(buffer)), 0, -1):
        if buffer.endswith(tag[:length]):
            return length
    return 0


def _parse_hermes_body(body: str) -> list[ParsedToolCall] | None:
    """`{"name": ..., "arguments": {...}}` -> a call; None when it is not one."""
    try:
        payload = json.loads(body)
    except ValueError:
        return None
    if not isinstance(payload, dict):
        return None
    name = payload.get("name")
    if not isinstance(name, str) or not name:
        return None
    arguments = payload.get("arguments", payload.get("parameters", {}))
    if isinstance(arguments, str):
        # Some models double-encode; keep the text when it already is JSON.
        try:
            json.loads(arguments)
            arguments_text = arguments
        except ValueError:
            arguments_text = json.dumps(arguments, ensure_ascii=False)
    else:
        arguments_text = json.dumps(arguments, ensure_ascii=False)
    return [ParsedToolCall(id=new_call_id(), name=name, arguments=arguments_text)]


# A call's body (between the markers, stripped) -> its calls, or None when it is not a call.
BodyParser = Callable[[str], "list[ParsedToolCall] | None"]


class MarkupToolCallParser:
    """Calls written as `start_tag body end_tag` (an empty `end_tag`: the call runs to the end of
    the output, as Mistral's `[TOOL_CALLS]`), the body decoded by `parse_body`.

    Whitespace between or after calls is dropped (it is layout, not an answer); any other text
    around calls is visible text.
    """

    def __init__(
        self,
        start_tag: str,
        end_tag: str,
        parse_body: BodyParser,
        *,
        max_call_chars: int = DEFAULT_MAX_CALL_CHARS,
        inner_markers: tuple[str, ...] = (),
        paired: tuple[tuple[str, str], ...] = (),
    ) -> None:
        self.start_tag = start_tag
        self.end_tag = end_tag
        self._parse_body = parse_body
        self._max_call_chars = max_call_chars
        # Every marker of the format: a malformed call's text is given back without them.
        self._markers = tuple(m for m in dict.fromkeys((start_tag, end_tag, *inner_markers)) if m)
        # Inner markup that comes in pairs (`<arg_value>` / `</arg_value>`; a quote twice): a body
        # where it does not pair up was cut by an end tag inside a value.
        self._pairs = paired
        self._buffer = ""
        self._inside = False
        # Inside a call: how far the buffer was already searched for the end tag, and the first
        # end tag found there whose body was not a whole call (an end tag inside an argument,
        # maybe: a later one may close the call).
        self._searched = 0
        self._first_end: int | None = None
        self._ends_tried = 0
        # After an over-long call given back as text: its end tag, when it comes, is dropped.
        self._skip_end_tag = False
        self._seen_call = False
        # Whitespace after a call, emitted only if real text follows.
        self._pending_space = ""

    def feed(self, text: str) -> list[Piece]:
        self._buffer += text
        pieces: list[Piece] = []
        while True:
            if self._inside:
                if not self._scan_call(pieces):
                    break
            elif not self._scan_text(pieces):
                break
        return pieces

    def finish(self) -> list[Piece]:
        pieces: list[Piece] = []
        if self._inside and self._first_end is not None:
            # No later end tag made a whole call: the call ends at its first end tag after all
            # (malformed, or as parsed), and what follows is read again.
            self._end_at_first_end(pieces)
            pieces.extend(self.feed(""))
            pieces.extend(self.finish())
            return pieces
        if self._inside and not self.end_tag:
            self._end_call(self._buffer, pieces)  # the call ran to the end of the output
        elif self._inside:
            self._unfinished(pieces)
            self._stream_ended()
        else:
            self._emit_text(self._buffer, pieces)
        self._buffer = ""
        self._inside = False
        self._skip_end_tag = False
        self._pending_space = ""
        return pieces

    def _emit_text(self, text: str, pieces: list[Piece]) -> None:
        if not text:
            return
        if self._seen_call and not text.strip():
            self._pending_space += text
            return
        text, self._pending_space = self._pending_space + text, ""
        if pieces and isinstance(pieces[-1], TextPiece):
            pieces[-1] = TextPiece(pieces[-1].text + text)
        else:
            pieces.append(TextPiece(text))

    def _scan_text(self, pieces: list[Piece]) -> bool:
        """Outside a call; True when a start tag was consumed (keep scanning)."""
        if self._skip_end_tag:
            return self._scan_over_long(pieces)
        index = self._buffer.find(self.start_tag)
        if index >= 0:
            self._emit_text(self._buffer[:index], pieces)
            self._buffer = self._buffer[index + len(self.start_tag) :]
            self._inside = True
            self._searched = 0
            self._first_end = None
            self._ends_tried = 0
            return True
        held = _held_prefix_length(self._buffer, self.start_tag)
        self._emit_text(self._buffer[: len(self._buffer) - held], pieces)
        self._buffer = self._buffer[len(self._buffer) - held :]
        return False

    def _scan_call(self, pieces: list[Piece]) -> bool:
        """Inside a call; True when the call ended (keep scanning the rest)."""
        start = max(0, self._searched - len(self.end_tag) + 1)
        index = self._buffer.find(self.end_tag, start) if self.end_tag else -1
        while index >= 0 and not self._whole_call(self._buffer[:index]):
            # An end tag inside the call's own text (an argument holding it), maybe: a later one
            # may close it. Bounded: each try parses the body.
            if self._first_end is None:
                self._first_end = index
            self._ends_tried += 1
            if self._ends_tried >= _MAX_END_TAGS_TRIED:
                self._end_at_first_end(pieces)
                return True
            index = self._buffer.find(self.end_tag, index + 1)
        if index < 0:
            self._searched = len(self._buffer)
            held = max(_held_prefix_length(self._buffer, marker) for marker in self._markers)
            if len(self._buffer) - held > self._max_call_chars:
                if self._first_end is not None:
                    self._end_at_first_end(pieces)
                    return True
                # Too long to be a call we would accept: its text (without the markup), no
                # longer a call; the end tag that closes it is dropped when it comes.
                MarkupToolCallParser._malformed(self, self._buffer[: len(self._buffer) - held], pieces)
                self._buffer = self._buffer[len(self._buffer) - held :]
                self._inside = False
                self._skip_end_tag = bool(self.end_tag)
                self._stream_ended()
                return False
            self._stream(pieces)
            return False
        body = self._buffer[:index]
        self._buffer = self._buffer[index + len(self.end_tag) :]
        self._end_call(body, pieces)
        return True

    def _scan_over_long(self, pieces: list[Piece]) -> bool:
        """The rest of an over-long call, as text without its markup, up to its end tag."""
        index = self._buffer.find(self.end_tag)
        # Up to its end tag, or (not there yet) short of what may be the start of any marker.
        held = max(_held_prefix_length(self._buffer, marker) for marker in self._markers)
        end = index if index >= 0 else len(self._buffer) - held
        MarkupToolCallParser._malformed(self, self._buffer[:end], pieces)
        if index < 0:
            self._buffer = self._buffer[end:]
            return False
        self._buffer = self._buffer[index + len(self.end_tag) :]
        self._skip_end_tag = False
        return True

    def _whole_call(self, body: str) -> bool:
        """Whether `body` is a whole call: it parses, its arguments are JSON objects and its
        inner markup pairs up (else the end tag that ended it may sit inside an argument)."""
        if len(body) > self._max_call_chars or not all(_paired(body, a, b) for a, b in self._pairs):
            return False
        calls = self._parse_body(body.strip())
        return calls is not None and all(_is_json_object(call.arguments) for call in calls)

    def _end_at_first_end(self, pieces: list[Piece]) -> None:
        """No end tag made a whole call: the call ends at the last end tag before another call
        starts (so markup inside its arguments stays in it), as parsed or malformed."""
        assert self._first_end is not None
        first, self._first_end = self._first_end, None
        next_start = self._buffer.find(self.start_tag, first)
        index = self._buffer.rfind(self.end_tag, first, next_start if next_start >= 0 else len(self._buffer))
        body = self._buffer[:index]
        self._buffer = self._buffer[index + len(self.end_tag) :]
        self._end_call(body, pieces)

    def _malformed(self, body: str, pieces: list[Piece]) -> None:
        """A call's markup around a body that is no call: its text, without the markup (markup is
        never an answer; the text is what the model wrote, so it is not dropped)."""
        for marker in self._markers:
            body = body.replace(marker, "")
        self._emit_text(body, pieces)

    def _stream(self, pieces: list[Piece]) -> None:
        """Inside a call, its end not seen yet: formats that can stream arguments do it here."""

    def _stream_ended(self) -> None:
        """The call being streamed was given back as text."""

    def _unfinished(self, pieces: list[Piece]) -> None:
        """The output ended inside a call (`self._buffer` holds its body so far). Its markup is
        not an answer, so it never becomes text; formats that stream a call's arguments leave it
        as the call they began (a client sees it `incomplete`)."""

    def _end_call(self, body: str, pieces: list[Piece]) -> None:
        self._inside = False
        if len(body) > self._max_call_chars:
            MarkupToolCallParser._malformed(self, body, pieces)  # over-long: never a call
            return
        calls = self._parse_body(body.strip())
        if calls is None:
            self._malformed(body, pieces)
            return
        self._pending_space = ""
        self._seen_call = True
        pieces.extend(ToolCallPiece(call) for call in calls)


# A Hermes call written name first (as the call grammar and Qwen write it): its arguments object
# starts where this match ends.
_HERMES_HEAD = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]+)"\s*,\s*"arguments"\s*:\s*(?=\{)')
_HERMES_HEAD_MAX = 512
# A call cut off after its name.
_HERMES_NAME = re.compile(r'\s*\{\s*"name"\s*:\s*"([^"\\]+)"')
# How far back from the end the outer object's closing brace and layout are looked for.
_TAIL_MAX = 64


class HermesToolCallParser(MarkupToolCallParser):
    """Qwen/Hermes markup: `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>`.

    A call written name first streams its arguments as they arrive (`ToolCallDeltaPiece`s): all
    of the arguments text except what could still be the outer object's closing brace. The call
    then carries exactly that text as its arguments.
    """

    def __init__(self, *, max_call_chars: int = DEFAULT_MAX_CALL_CHARS) -> None:
        super().__init__("<tool_call>", "</tool_call>", _parse_hermes_body, max_call_chars=max_call_chars)
        # The call being streamed: (id, name, where its arguments start in the buffer); how far
        # (buffer offset) its arguments were sent.
        self._streaming: tuple[str, str, int] | None = None
        self._sent_to = 0

    def _stream(self, pieces: list[Piece]) -> None:
        buffer = self._buffer
        if self._streaming is None:
            if len(buffer) > _HERMES_HEAD_MAX:
                return
            match = _HERMES_HEAD.match(buffer)
            if match is None:
                return
            self._streaming = (new_call_id(), match.group(1), match.end())
            self._sent_to = match.end()
            pieces.append(ToolCallDeltaPiece(self._streaming[0], match.group(1), ""))
        end = len(buffer) - _held_prefix_length(buffer, self.end_tag)
        if self._first_end is not None:
            end = min(end, self._first_end)  # past an end tag it is undecided what follows is
        end = _without_closing_brace(buffer, max(self._sent_to, end - _TAIL_MAX), end)
        if end > self._sent_to:
            pieces.append(ToolCallDeltaPiece(self._streaming[0], "", buffer[self._sent_to : end]))
            self._sent_to = end

    def _stream_ended(self) -> None:
        self._streaming = None

    def _unfinished(self, pieces: list[Piece]) -> None:
        if self._streaming is not None:
            return  # its deltas are the call as far as written
        named = _HERMES_NAME.match(self._buffer)
        if named is not None:
            # Cut off before its arguments began: the call by its name, no arguments yet.
            pieces.append(ToolCallDeltaPiece(new_call_id(), named.group(1), ""))

    def _malformed(self, body: str, pieces: list[Piece]) -> None:
        """A body that is no JSON call: a call after all when it names one (its arguments as
        written), else its text."""
        head = _HERMES_HEAD.match(body) or _HERMES_NAME.match(body)
        if head is None:
            super()._malformed(body, pieces)
            return
        end = _without_closing_brace(body, head.end(), len(body.rstrip()))
        arguments = body[head.end() : end] if head.re is _HERMES_HEAD else ""
        self._pending_space = ""
        self._seen_call = True
        pieces.append(
            ToolCallPiece(ParsedToolCall(id=new_call_id(), name=head.group(1), arguments=arguments))
        )

    def _end_call(self, body: str, pieces: list[Piece]) -> None:
        streaming, self._streaming = self._streaming, None
        if streaming is None:
            super()._end_call(body, pieces)
            return
        call_id, name, start = streaming
        arguments_end = _without_closing_brace(body, start, len(body))
        arguments = body[start:arguments_end]
        calls = _parse_hermes_body(body.strip())
        if calls is not None and (
            [call.name for call in calls] != [name]
            or arguments_end < self._sent_to
            or not _is_json_object(arguments)
        ):
            super()._end_call(body, pieces)  # written otherwise after all: whole, as parsed
            return
        # A whole call, or a malformed one whose deltas began it: the call with its arguments
        # as written (as OpenAI reports arguments that are not JSON: the client validates).
        arguments_end = max(arguments_end, self._sent_to)
        arguments = body[start:arguments_end]
        self._inside = False
        if arguments_end > self._sent_to:
            pieces.append(ToolCallDeltaPiece(call_id, "", body[self._sent_to : arguments_end]))
        self._pending_space = ""
        self._seen_call = True
        pieces.append(ToolCallPiece(ParsedToolCall(id=call_id, name=name, arguments=arguments)))


def _paired(body: str, opening: str, closing: str) -> bool:
    if opening == closing:  # a quote
        return body.count(opening) % 2 == 0
    return body.count(opening) == body.count(closing)


def _without_closing_brace(text: str, floor: int, end: int) -> int:
    """`end` moved back over trailing layout, one `}` and layout before it (the outer object's
    end, maybe), not below `floor`."""
    while end > floor and text[end - 1].isspace():
        end -= 1
    if end > floor and text[end - 1] == "}":
        end -= 1
        while end > floor and text[end - 1].isspace():
            end -= 1
    return end


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


class LlamaJsonToolCallParser:
    """Llama's JSON calls: an answer that starts with `{` (or `<|python_start|>`) is held to the
    end and read as calls, `{"name": ..., "parameters": {...}}` objects separated by `;` or
    whitespace (Llama 4's template writes earlier calls this way; vLLM's llama JSON parsers read
    the same); anything else in it, or an over-long one, makes it all text. Other answers
    stream as text. So a JSON answer from these models streams only at its end."""

    def __init__(self, *, max_call_chars: int = DEFAULT_MAX_CALL_CHARS) -> None:
        self._max_call_chars = max_call_chars
        self._buffer = ""
        # None: undecided (only whitespace so far); True: holding a possible call; False: text.
        self._calls: bool | None = None

    def feed(self, text: str) -> list[Piece]:
        if self._calls is False:
            return [TextPiece(text)] if text else []
        self._buffer += text
        if self._calls is None:
            start = self._buffer.lstrip()
            if not start or LLAMA_PYTHON_START.startswith(start):
                return []
            self._calls = start.startswith(("{", LLAMA_PYTHON_START))
        if self._calls and len(self._buffer) <= self._max_call_chars:
            return []
        self._calls, text, self._buffer = False, self._buffer, ""
        return [TextPiece(text)]

    def finish(self) -> list[Piece]:
        text, self._buffer = self._buffer, ""
        calls = _parse_llama_calls(text) if self._calls else None
        if calls is not None:
            return [ToolCallPiece(call) for call in calls]
        return [TextPiece(text)] if text else []


def _parse_llama_calls(text: str) -> list[ParsedToolCall] | None:
    body = text.strip()
    if body.startswith(LLAMA_PYTHON_START):
        body = body[len(LLAMA_PYTHON_START) :].removesuffix(LLAMA_PYTHON_END)
    decoder = json.JSONDecoder()
    calls: list[ParsedToolCall] = []
    at = 0
    while True:
        while at < len(body) and (body[at].isspace() or body[at] == ";"):
            at += 1
        if at == len(body):
            return calls or None
        try:
            value, at = decoder.raw_decode(body, at)
        except ValueError:
            return None
        # A call names its arguments: a JSON answer that merely has a "name" is not one.
        is_call = isinstance(value, dict) and ("parameters" in value or "arguments" in value)
        parsed = _parse_hermes_body(json.dumps(value)) if is_call else None
        if parsed is None:
            return None
        calls.extend(parsed)
