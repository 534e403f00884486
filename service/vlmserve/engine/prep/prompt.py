"""Contract messages -> the model's chat template -> prompt text. Pure: no MLX, no server.

`render_prompt` is the one place a conversation becomes a prompt, for the engine and for
anything that must build prompts exactly as the engine does (e.g. training data):

    from transformers import AutoTokenizer
    from vlmserve.engine.prep.prompt import render_prompt
    tokenizer = AutoTokenizer.from_pretrained("models/qwen2-vl-tiny")
    rendered = render_prompt(messages, template=tokenizer)      # messages: Sequence[pb.Message]
    rendered.text    # the prompt, ending with the assistant generation prompt
    rendered.images  # PromptImage(part, where) per image, in prompt order

Rules (violations raise `RequestError` INVALID_ARGUMENT naming the rule and the field, by its
path in the request as sent):
- the conversation is lowered first (`lowering.py` `lower_conversation`, the one implementation;
  callers send it raw): images in tool outputs and in assistant, system or developer turns move
  to a user turn right after, and a part-list tool output becomes text (text parts joined with
  "\\n", JSON parts as one JSON-array line, the marker line when it held images). The lowering
  is idempotent, so a conversation a caller already lowered renders exactly the same;
- file parts are refused anywhere (the engine does not read documents); video and audio parts
  are placed like images (`clip_content`) and rendered by the family's processor
  (`clip_inputs.py`), or refused by name where the family cannot take them;
- a JSON part in a message is rendered as its JSON text;
- developer turns render as system turns (chat templates have no developer role);
- an assistant turn's `reasoning_text` is passed as its `reasoning_content`, the variable
  thinking templates (Qwen3's) render; a template without it drops the text;
- tool choice: NONE renders no tools and parses no calls; AUTO, REQUIRED and a named function
  render the tools (a named function must be one of them); the grammar (`grammar/compiler.py`) enforces
  the choice while decoding;
- response_format json_object/json_schema adds an instruction to the system turn (the grammar
  enforces it; the instruction tells the model what it is writing).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from jinja2 import TemplateError

from vlmserve.engine.prep.lowering import LoweredMessage, lower_conversation
from vlmserve.engine.request_errors import invalid_argument
from vlmserve.engine.template_fit import ChatTemplate, fit_messages, probe
from vlmserve.engine.toolcalls.registry import HERMES_FORMAT
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = [
    "PromptImage",
    "RenderedPrompt",
    "TemplateConversation",
    "ToolMode",
    "render_prompt",
    "to_template_conversation",
]

log = logging.getLogger(__name__)

# JSON in a request (tool parameters, call arguments, a response schema) is parsed here and then
# walked by the chat template; deeper nesting than this is refused, not left to hit the stack.
MAX_JSON_DEPTH = 100

_ROLE_NAMES: Mapping[int, str] = {
    pb.ROLE_SYSTEM: "system",
    pb.ROLE_DEVELOPER: "system",
    pb.ROLE_USER: "user",
    pb.ROLE_ASSISTANT: "assistant",
    pb.ROLE_TOOL: "tool",
}

ToolMode = str  # "none" | "auto" | "required" | "function"


@dataclass(frozen=True, slots=True)
class PromptImage:
    part: pb.ImagePart
    # Where it came from, for error messages: "messages[2].parts[0]".
    where: str


@dataclass(frozen=True, slots=True)
class PromptClip:
    """A video or audio part in prompt order; its template entry is `{"type": "video"}` or
    `{"type": "audio"}`, which the family's template writes as its placeholder."""

    part: pb.Part
    where: str

    @property
    def kind(self) -> str:
        """ "video" or "audio"."""
        return str(self.part.WhichOneof("kind"))


@dataclass(frozen=True, slots=True)
class TemplateConversation:
    """The chat-template inputs for a request, before rendering."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    images: tuple[PromptImage, ...]
    tool_mode: ToolMode
    tool_names: frozenset[str] = field(default_factory=frozenset)
    # Video and audio parts, in prompt order (prep/clip_inputs.py renders them per family).
    clips: tuple[PromptClip, ...] = ()
    # The function a named tool choice forces.
    forced_name: str | None = None
    # The template's `enable_thinking` variable; None: not passed (the template's default).
    enable_thinking: bool | None = None


@dataclass(frozen=True, slots=True)
class RenderedPrompt:
    # The prompt, generation prompt included.
    text: str
    images: tuple[PromptImage, ...]
    tool_mode: ToolMode
    forced_name: str | None = None


_NOT_JSON: Any = object()


def _json_depth(value: Any) -> int:
    """Nesting depth of parsed JSON, without recursion."""
    deepest = 0
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, dict | list):
            deepest = max(deepest, depth)
            stack.extend((child, depth + 1) for child in (item.values() if isinstance(item, dict) else item))
    return deepest


def _parse_json(text: str, *, field: str) -> Any:
    """The parsed value, or `_NOT_JSON`; nesting deeper than MAX_JSON_DEPTH is INVALID_ARGUMENT."""
    try:
        value = json.loads(text)
    except RecursionError:  # far deeper than the limit (json's C parser recurses per level)
        value, depth = None, MAX_JSON_DEPTH + 1
    except ValueError:
        return _NOT_JSON
    else:
        depth = _json_depth(value)
    if depth > MAX_JSON_DEPTH:
        raise invalid_argument(f"{field} is nested more than {MAX_JSON_DEPTH} levels deep", field=field)
    return value


def _json_value(text: str, *, field: str) -> Any:
    value = _parse_json(text, field=field)
    if value is _NOT_JSON:
        raise invalid_argument(f"{field} is not valid JSON", field=field)
    return value


def _tool_mode(choice: pb.ToolChoice | None, tool_names: frozenset[str]) -> tuple[ToolMode, str | None]:
    """(mode, forced function name) from the request's tool choice."""
    kind = choice.WhichOneof("choice") if choice is not None else None
    if kind == "function_name":
        assert choice is not None
        name = choice.function_name
        if not name:
            raise invalid_argument(
                "tool_choice.function_name must not be empty", field="tool_choice.function_name"
            )
        if name not in tool_names:
            known = ", ".join(sorted(tool_names)) or "none"
            raise invalid_argument(
                f"tool_choice.function_name {name!r} is not one of the request's tools ({known})",
                field="tool_choice.function_name",
            )
        return "function", name
    mode = choice.mode if kind == "mode" and choice is not None else pb.TOOL_CHOICE_MODE_UNSPECIFIED
    if mode == pb.TOOL_CHOICE_MODE_UNSPECIFIED:
        return ("auto" if tool_names else "none"), None
    if mode == pb.TOOL_CHOICE_MODE_NONE:
        return "none", None
    if mode == pb.TOOL_CHOICE_MODE_AUTO:
        return ("auto" if tool_names else "none"), None
    if mode == pb.TOOL_CHOICE_MODE_REQUIRED:
        if not tool_names:
            raise invalid_argument(
                "tool_choice is REQUIRED but the request has no tools", field="tool_choice.mode"
            )
        return "required", None
    raise invalid_argument(
        f"tool_choice.mode {mode} is not a known tool choice mode", field="tool_choice.mode"
    )


def _tools(tools: Sequence[pb.Tool]) -> tuple[list[dict[str, Any]], frozenset[str]]:
    rendered: list[dict[str, Any]] = []
    names: set[str] = set()
    for index, tool in enumerate(tools):
        if tool.WhichOneof("kind") != "function":
            raise invalid_argument(
                f"tools[{index}]: only function tools are supported", field=f"tools[{index}]"
            )
        function = tool.function
        if not function.name:
            raise invalid_argument(
                f"tools[{index}].function.name must not be empty", field=f"tools[{index}].function.name"
            )
        if function.name in names:
            raise invalid_argument(
                f"tools[{index}]: duplicate tool name {function.name!r}",
                field=f"tools[{index}].function.name",
            )
        names.add(function.name)
        parameters: Any = {"type": "object", "properties": {}}
        if function.parameters_json:
            parameters = _json_value(
                function.parameters_json, field=f"tools[{index}].function.parameters_json"
            )
        spec: dict[str, Any] = {"name": function.name}
        if function.description:
            spec["description"] = function.description
        spec["parameters"] = parameters
        rendered.append({"type": "function", "function": spec})
    return rendered, frozenset(names)


def _message_content(
    lowered: LoweredMessage, images: list[PromptImage], clips: list[PromptClip]
) -> list[dict[str, Any]]:
    content: list[dict[str, Any]] = []
    for part, part_where in zip(lowered.message.parts, lowered.part_sources, strict=True):
        kind = part.WhichOneof("kind")
        if kind == "text":
            content.append({"type": "text", "text": part.text.text})
        elif kind == "json":
            content.append({"type": "text", "text": part.json.json})
        elif kind == "image":  # only in user turns: the lowering moved the others
            if not part.image.data:
                raise invalid_argument(f"{part_where}: image data is empty", field=f"{part_where}.image.data")
            images.append(PromptImage(part=part.image, where=part_where))
            content.append({"type": "image"})
        elif kind == "file":
            name = part.file.filename or part.file.file_id or "unnamed"
            raise invalid_argument(
                f"{part_where}: file inputs ({name!r}) are not supported by this engine", field=part_where
            )
        elif kind in ("video", "audio"):  # only in user turns: the lowering moved the others
            content.append(clip_content(part, part_where, clips))
        else:
            raise invalid_argument(
                f"{part_where}: empty part (no text, image, video, audio, file or json)", field=part_where
            )
    return content


def clip_content(part: pb.Part, where: str, clips: list[PromptClip]) -> dict[str, Any]:
    """The template entry of a video or audio part (`{"type": "video"}` / `{"type": "audio"}`,
    which the family's template writes as its placeholder); the part joins `clips`, which
    prep/clip_inputs.py renders with the family's processor. Empty sources are refused here."""
    kind = str(part.WhichOneof("kind"))
    source = getattr(part, kind).WhichOneof("source")
    if source is None:
        raise invalid_argument(f"{where}: the {kind} part has no data", field=f"{where}.{kind}")
    if source == "file_id":
        raise invalid_argument(
            f"{where}: {kind} file_id references are resolved by the facade; send the bytes",
            field=f"{where}.{kind}.file_id",
        )
    clips.append(PromptClip(part=part, where=where))
    return {"type": kind}


def _assistant_tool_calls(message: pb.Message, where: str) -> list[dict[str, Any]]:
    calls: list[dict[str, Any]] = []
    for index, call in enumerate(message.tool_calls):
        if not call.name:
            raise invalid_argument(
                f"{where}.tool_calls[{index}].name must not be empty",
                field=f"{where}.tool_calls[{index}].name",
            )
        arguments: Any
        if call.kind == pb.TOOL_KIND_CUSTOM:
            # Free-form input: shown as a JSON string so the markup stays JSON.
            arguments = json.dumps(call.arguments, ensure_ascii=False)
        elif not call.arguments:
            arguments = {}
        else:
            arguments = _parse_json(call.arguments, field=f"{where}.tool_calls[{index}].arguments")
            if arguments is _NOT_JSON:
                arguments = call.arguments  # history as the model wrote it
        calls.append(
            {"id": call.id, "type": "function", "function": {"name": call.name, "arguments": arguments}}
        )
    return calls


def _format_instruction(response_format: pb.ResponseFormat | None) -> str:
    kind = response_format.WhichOneof("format") if response_format is not None else None
    if response_format is None or kind in (None, "text"):
        return ""
    if kind == "json_object":
        return "Respond with a single JSON object and nothing else."
    schema = response_format.json_schema
    if schema.schema_json:
        _json_value(schema.schema_json, field="response_format.json_schema.schema_json")
    text = "Respond with a single JSON object that matches this JSON schema, and nothing else"
    if schema.name:
        text += f" (schema {schema.name!r})"
    if schema.description:
        text += f" ({schema.description})"
    return f"{text}:\n{schema.schema_json or '{}'}"


def _add_system_instruction(messages: list[dict[str, Any]], instruction: str) -> None:
    if not instruction:
        return
    if messages and messages[0]["role"] == "system":
        messages[0]["content"] = [*messages[0]["content"], {"type": "text", "text": "\n\n" + instruction}]
    else:
        messages.insert(0, {"role": "system", "content": [{"type": "text", "text": instruction}]})


def to_template_conversation(
    messages: Sequence[pb.Message],
    *,
    tools: Sequence[pb.Tool] = (),
    tool_choice: pb.ToolChoice | None = None,
    response_format: pb.ResponseFormat | None = None,
    tool_call_format: str = HERMES_FORMAT,
    enable_thinking: bool | None = None,
) -> TemplateConversation:
    """Validate contract messages and convert them to chat-template inputs (no rendering)."""
    if not messages:
        raise invalid_argument("messages must not be empty", field="messages")
    tool_specs, tool_names = _tools(tools)
    mode, forced_name = _tool_mode(tool_choice, tool_names)
    if mode in ("required", "function") and not tool_call_format:
        raise invalid_argument(
            "this model has no tool-call format, so tool_choice cannot force a call", field="tool_choice"
        )
    lowered = lower_conversation(messages)
    images: list[PromptImage] = []
    clips: list[PromptClip] = []
    converted: list[dict[str, Any]] = []
    for entry in lowered:
        message, where = entry.message, entry.source
        role = _ROLE_NAMES[message.role]  # the lowering refused any other role
        if message.tool_calls and role != "assistant":
            raise invalid_argument(
                f"{where}: only assistant turns may carry tool_calls", field=f"{where}.tool_calls"
            )
        if message.reasoning_text and role != "assistant":
            raise invalid_argument(
                f"{where}: only assistant turns may carry reasoning_text", field=f"{where}.reasoning_text"
            )
        if message.HasField("tool_output") and role != "tool":
            raise invalid_argument(
                f"{where}: only tool turns may carry tool_output", field=f"{where}.tool_output"
            )
        if role == "tool":  # parts on a tool turn: the lowering refused them
            if not message.HasField("tool_output"):
                raise invalid_argument(
                    f"{where}: a tool turn needs tool_output", field=f"{where}.tool_output"
                )
            turn: dict[str, Any] = {
                "role": "tool",
                "content": message.tool_output.text,  # the lowering made part lists text
                "tool_call_id": message.tool_output.call_id,
            }
        else:
            turn = {"role": role, "content": _message_content(entry, images, clips)}
            if role == "assistant" and message.tool_calls:
                turn["tool_calls"] = _assistant_tool_calls(message, where)
            if message.reasoning_text:
                # Qwen3-style templates render it (as `<think>...</think>`); others ignore it.
                turn["reasoning_content"] = message.reasoning_text
        converted.append(turn)
    _add_system_instruction(converted, _format_instruction(response_format))
    return TemplateConversation(
        messages=converted,
        tools=tool_specs if mode != "none" and tool_specs else None,
        images=tuple(images),
        tool_mode=mode,
        tool_names=tool_names,
        clips=tuple(clips),
        forced_name=forced_name,
        enable_thinking=enable_thinking,
    )


def render_conversation(conversation: TemplateConversation, template: ChatTemplate) -> RenderedPrompt:
    """Render already-converted inputs with the model's chat template, fitted to what it renders."""
    messages, tools = fit_messages(conversation.messages, conversation.tools, probe(template))
    try:
        # A template without a thinking switch ignores the extra variable.
        switch = (
            {} if conversation.enable_thinking is None else {"enable_thinking": conversation.enable_thinking}
        )
        text = template.apply_chat_template(
            messages,
            tools=tools,
            add_generation_prompt=True,
            tokenize=False,
            **switch,
        )
    except TemplateError as error:
        # Only the template's own words (its raise_exception) are shown; jinja's and Python's
        # (undefined names, recursion, types) are internals.
        said = f": {error.message}" if type(error) is TemplateError and error.message else ""
        if not said:
            log.warning("chat template failed: %s: %s", type(error).__name__, error)
        raise invalid_argument(
            f"the model's chat template rejected the conversation{said}", field="messages"
        ) from None
    except (RecursionError, ValueError, TypeError, LookupError) as error:
        log.warning("chat template failed: %s: %s", type(error).__name__, error)
        raise invalid_argument(
            "the model's chat template could not render the conversation", field="messages"
        ) from None
    if not isinstance(text, str):
        raise invalid_argument("the model's chat template did not produce text", field="messages")
    return RenderedPrompt(
        text=text,
        images=conversation.images,
        tool_mode=conversation.tool_mode,
        forced_name=conversation.forced_name,
    )


def render_prompt(
    messages: Sequence[pb.Message],
    *,
    template: ChatTemplate,
    tools: Sequence[pb.Tool] = (),
    tool_choice: pb.ToolChoice | None = None,
    response_format: pb.ResponseFormat | None = None,
    tool_call_format: str = HERMES_FORMAT,
) -> RenderedPrompt:
    """The prompt the engine would build for these messages (see the module docstring).

    `template`: the model's tokenizer (or processor) with its chat template, e.g.
    `AutoTokenizer.from_pretrained(model_dir)` or `processor.tokenizer` from `mlx_vlm.load`.
    Raises `RequestError` (INVALID_ARGUMENT) for input the engine would refuse.
    """
    conversation = to_template_conversation(
        messages,
        tools=tools,
        tool_choice=tool_choice,
        response_format=response_format,
        tool_call_format=tool_call_format,
    )
    return render_conversation(conversation, template)
