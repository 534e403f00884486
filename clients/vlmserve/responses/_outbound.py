"""Contract messages and results -> Responses JSON (docs/responses-api.md, "Output").

Images always go back out: a tool result keeps its images as `input_image` parts of an
`output` array, in their original order, each with `detail` (default "auto"); an image-only
tool result never becomes "".
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from vlmserve.common.clips import AUDIO_FORMATS, sniff_audio, sniff_video
from vlmserve.common.images import sniff_media_type
from vlmserve.engine.v1 import engine_pb2 as pb

from ._computer import computer_call_item
from ._media import DETAIL_NAMES
from ._output_models import (
    CustomToolCallItem,
    FunctionCallItem,
    InputImageContent,
    InputTokensDetails,
    ItemStatus,
    LogProb,
    OutputMessage,
    OutputTextContent,
    OutputTokensDetails,
    ReasoningItem,
    ReasoningTextContent,
    ToolCallItem,
    TopLogProb,
    Usage,
)
from ._tools import OfferedTool

NewId = Callable[[str], str]

_ROLE_NAMES = {
    pb.ROLE_SYSTEM: "system",
    pb.ROLE_DEVELOPER: "developer",
    pb.ROLE_USER: "user",
    pb.ROLE_ASSISTANT: "assistant",
}


def messages_to_items(
    messages: Sequence[pb.Message], *, offered_tools: Mapping[str, OfferedTool] | None = None
) -> list[dict[str, Any]]:
    """Turn contract messages back into Responses input items, nothing dropped."""
    items: list[dict[str, Any]] = []
    for message in messages:
        if message.role == pb.ROLE_TOOL:
            items.append(_tool_output_item(message.tool_output))
            continue
        role = _ROLE_NAMES.get(message.role, "user")
        if message.reasoning_text:
            items.append(
                {"type": "reasoning", "summary": [], "content": [_reasoning_part(message.reasoning_text)]}
            )
        if message.parts or not message.tool_calls:
            content = [_content_part(part, assistant=role == "assistant") for part in message.parts]
            items.append({"type": "message", "role": role, "content": content})
        items.extend(_call_item(call, offered_tools) for call in message.tool_calls)
    return items


def _reasoning_part(text: str) -> dict[str, Any]:
    return {"type": "reasoning_text", "text": text}


def result_to_output_items(
    result: pb.GenerateResult,
    *,
    new_id: NewId,
    offered_tools: Mapping[str, OfferedTool] | None = None,
) -> list[OutputMessage | ToolCallItem | ReasoningItem]:
    """A GenerateResult as Responses `output` items: the reasoning (if any), the message (if any
    text), then tool calls.

    `new_id(prefix)` makes item ids; prefixes used: "rs", "msg", "fc", "ctc", "cu" and "call" (a call id,
    only when the engine gave none).
    """
    items: list[OutputMessage | ToolCallItem | ReasoningItem] = []
    if result.reasoning_text:
        items.append(reasoning_output_item(result.reasoning_text, item_id=new_id("rs")))
    if result.text or not result.tool_calls:
        status: ItemStatus = "incomplete" if result.finish_reason == pb.FINISH_REASON_LENGTH else "completed"
        items.append(
            message_output_item(
                result.text,
                item_id=new_id("msg"),
                status=status,
                logprobs=logprobs_from_contract(result.logprobs),
            )
        )
    items.extend(
        tool_call_output_item(call, new_id=new_id, offered_tools=offered_tools) for call in result.tool_calls
    )
    return items


def message_output_item(
    text: str, *, item_id: str, status: ItemStatus = "completed", logprobs: Sequence[LogProb] = ()
) -> OutputMessage:
    """An assistant `message` output item with one `output_text` part."""
    return OutputMessage(id=item_id, status=status, content=[output_text_part(text, logprobs)])


def reasoning_output_item(text: str, *, item_id: str) -> ReasoningItem:
    """A `reasoning` output item with one `reasoning_text` part."""
    return ReasoningItem(id=item_id, content=[ReasoningTextContent(text=text)])


def output_text_part(text: str, logprobs: Sequence[LogProb] = ()) -> OutputTextContent:
    return OutputTextContent(text=text, logprobs=list(logprobs))


def logprobs_from_contract(entries: Iterable[pb.TokenLogprob]) -> list[LogProb]:
    """The engine's token logprobs in OpenAI's shape (`bytes`: the token text's UTF-8).

    Built without validation (`model_construct`: the contract's types are already the fields'),
    the logprobs at float32's precision: the contract's float is a float32, which Python widens
    to a double printed with 17 digits (-0.10000000149011612); 7 significant digits are all it
    holds, and 21 such numbers per token with `top_logprobs: 20` were a third of the bytes."""
    return [
        LogProb.model_construct(
            token=entry.token,
            logprob=_float32(entry.logprob),
            bytes=list(entry.token.encode()),
            top_logprobs=[
                TopLogProb.model_construct(
                    token=top.token, logprob=_float32(top.logprob), bytes=list(top.token.encode())
                )
                for top in entry.top_logprobs
            ],
        )
        for entry in entries
    ]


def _float32(value: float) -> float:
    """A float32 widened to a double, as the double nearest it with 7 significant digits."""
    return float(f"{value:.7g}")


def tool_call_output_item(
    call: pb.ToolCall, *, new_id: NewId, offered_tools: Mapping[str, OfferedTool] | None = None
) -> ToolCallItem:
    """A model's tool call as a `function_call` (or `custom_tool_call`) output item."""
    if call.kind == pb.TOOL_KIND_COMPUTER:
        computer = (offered_tools or {}).get(call.name)
        # The `computer` tool's clients read the batched `actions`; computer_use_preview's `action`.
        batched = computer is None or computer.computer is None or computer.computer.type == "computer"
        return computer_call_item(
            call, item_id=new_id("cu"), call_id=call.id or new_id("call"), batched=batched
        )
    item = _call_item(call, offered_tools)
    if item["type"] == "custom_tool_call":
        return CustomToolCallItem.model_validate(
            {**item, "id": new_id("ctc"), "call_id": call.id or new_id("call")}
        )
    return FunctionCallItem.model_validate({**item, "id": new_id("fc"), "call_id": call.id or new_id("call")})


def usage_from_contract(usage: pb.Usage) -> Usage:
    return Usage(
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        total_tokens=usage.input_tokens + usage.output_tokens,
        input_tokens_details=InputTokensDetails(cached_tokens=usage.cached_tokens),
        output_tokens_details=OutputTokensDetails(reasoning_tokens=usage.reasoning_tokens),
    )


def image_part_to_json(image: pb.ImagePart) -> dict[str, Any]:
    """An `input_image` part with a data: URL and `detail` always present."""
    media_type = image.media_type or sniff_media_type(image.data) or "application/octet-stream"
    encoded = base64.b64encode(image.data).decode("ascii")
    part = InputImageContent(
        image_url=f"data:{media_type};base64,{encoded}", detail=DETAIL_NAMES.get(image.detail, "auto")
    )
    return part.to_json()


def _call_item(call: pb.ToolCall, offered_tools: Mapping[str, OfferedTool] | None) -> dict[str, Any]:
    if call.kind == pb.TOOL_KIND_COMPUTER:
        computer = (offered_tools or {}).get(call.name)
        batched = computer is None or computer.computer is None or computer.computer.type == "computer"
        item = computer_call_item(call, item_id="", call_id=call.id, batched=batched).to_json()
        del item["id"]  # an input item (a listing, a replay) needs none
        return item
    offered = (offered_tools or {}).get(call.name)
    name = offered.name if offered is not None else call.name
    namespace = {"namespace": offered.namespace} if offered is not None and offered.namespace else {}
    if call.kind == pb.TOOL_KIND_CUSTOM:
        return {
            "type": "custom_tool_call",
            "call_id": call.id,
            "name": name,
            "input": call.arguments,
            **namespace,
        }
    if offered is not None and offered.kind == "custom":
        # Offered as a function taking {"input": string}; goes back out as the custom call it is.
        return {
            "type": "custom_tool_call",
            "call_id": call.id,
            "name": name,
            "input": _custom_input(call.arguments),
            **namespace,
        }
    return {
        "type": "function_call",
        "call_id": call.id,
        "name": name,
        "arguments": call.arguments,
        "status": "completed",
        **namespace,
    }


def _custom_input(arguments: str) -> str:
    try:
        parsed = json.loads(arguments)
    except ValueError:
        return arguments
    if isinstance(parsed, dict) and isinstance(parsed.get("input"), str):
        return str(parsed["input"])
    return arguments


def _tool_output_item(output: pb.ToolOutput) -> dict[str, Any]:
    if output.kind == pb.TOOL_KIND_COMPUTER:
        images = [part.image for part in output.parts.parts if part.WhichOneof("kind") == "image"]
        screenshot: dict[str, Any] = {"type": "computer_screenshot"}
        if images:
            screenshot["image_url"] = image_part_to_json(images[0])["image_url"]
        return {"type": "computer_call_output", "call_id": output.call_id, "output": screenshot}
    item_type = "custom_tool_call_output" if output.kind == pb.TOOL_KIND_CUSTOM else "function_call_output"
    value: str | list[dict[str, Any]]
    if output.WhichOneof("output") == "parts":
        value = [_tool_output_part(part) for part in output.parts.parts]
    else:
        value = output.text
    return {"type": item_type, "call_id": output.call_id, "output": value}


def _tool_output_part(part: pb.Part) -> dict[str, Any]:
    kind = part.WhichOneof("kind")
    if kind == "text":
        return {"type": "input_text", "text": part.text.text}
    return _non_text_part(part)


def _content_part(part: pb.Part, *, assistant: bool) -> dict[str, Any]:
    if part.WhichOneof("kind") == "text":
        if assistant:
            return output_text_part(part.text.text).to_json()
        return {"type": "input_text", "text": part.text.text}
    return _non_text_part(part)


def _non_text_part(part: pb.Part) -> dict[str, Any]:
    kind = part.WhichOneof("kind")
    if kind == "image":
        return image_part_to_json(part.image)
    if kind == "file":
        return _file_part_to_json(part.file)
    if kind == "json":
        return _json_part(part.json.json)
    if kind == "video":
        return video_part_to_json(part.video)
    if kind == "audio":
        return audio_part_to_json(part.audio)
    return {"type": "input_text", "text": ""}


def _data_url(media_type: str, data: bytes) -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode('ascii')}"


def video_part_to_json(video: pb.VideoPart) -> dict[str, Any]:
    """An `input_video` part (a `video` part with its frames), its sampling beside it."""
    sampling = video.sampling
    asked: dict[str, float] = {
        "max_frames": sampling.max_frames,
        "min_pixels": sampling.min_pixels,
        "max_pixels": sampling.max_pixels,
    }
    item: dict[str, Any]
    if video.WhichOneof("source") == "frames":
        frames = [image_part_to_json(frame)["image_url"] for frame in video.frames.frames]
        item = {"type": "video", "video": frames}
        # A frame list's `fps` is the rate it was taken at.
        asked["fps"] = _float32(video.frames.fps) if video.frames.fps else 0
    elif video.WhichOneof("source") == "file_id":
        item = {"type": "input_video", "file_id": video.file_id}
        asked["fps"] = _float32(sampling.fps) if sampling.fps else 0
    else:
        media_type = video.media_type or sniff_video(video.data) or "application/octet-stream"
        item = {"type": "input_video", "video_url": _data_url(media_type, video.data)}
        asked["fps"] = _float32(sampling.fps) if sampling.fps else 0
    item.update({name: value for name, value in asked.items() if value})
    return item


def audio_part_to_json(audio: pb.AudioPart) -> dict[str, Any]:
    """An `input_audio` part: OpenAI's {data, format} (bare base64), or an uploaded file's id."""
    if audio.WhichOneof("source") == "file_id":
        return {"type": "input_audio", "file_id": audio.file_id}
    media_type = audio.media_type or sniff_audio(audio.data) or ""
    formats = {value: name for name, value in AUDIO_FORMATS.items()}
    data = base64.b64encode(audio.data).decode("ascii")
    return {"type": "input_audio", "input_audio": {"data": data, "format": formats.get(media_type, "wav")}}


def _json_part(text: str) -> dict[str, Any]:
    """The caller's own part back, as it sent it; text that is not a JSON object stays text."""
    try:
        parsed = json.loads(text)
    except ValueError:
        return {"type": "input_text", "text": text}
    if isinstance(parsed, dict):
        return parsed
    return {"type": "input_text", "text": text}


def _file_part_to_json(file: pb.FilePart) -> dict[str, Any]:
    item: dict[str, Any] = {"type": "input_file"}
    if file.WhichOneof("source") == "file_id":
        item["file_id"] = file.file_id
    elif file.WhichOneof("source") == "data":
        media_type = file.media_type or "application/octet-stream"
        item["file_data"] = _data_url(media_type, file.data)
    if file.filename:
        item["filename"] = file.filename
    return item
