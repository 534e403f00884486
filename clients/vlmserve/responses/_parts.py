"""Content parts (docs/responses-api.md, Input) -> contract parts, on messages and in tool outputs.

The parts arrive validated (`_request_models`); what is left here is what a schema cannot say:
an image needs its URL or a `file_id`, every image goes through the media policy, and a file
(`input_file`) may become several parts (a PDF: each page's text and image; `_files.py`).
"""

from __future__ import annotations

import json
from typing import Any

from google.protobuf.internal.containers import RepeatedCompositeFieldContainer

from vlmserve.common.wire_encode import HeldTexts
from vlmserve.engine.v1 import engine_pb2 as pb

from ._clip_models import (
    AudioURLPartParam,
    ChatVideoURLPartParam,
    InputAudioPartParam,
    InputVideoPartParam,
    VideoPartParam,
)
from ._clips import audio_part, video_part
from ._errors import InvalidRequestError
from ._files import file_image, input_file_parts
from ._input_models import (
    IMAGE_PART_TYPES,
    TEXT_PART_TYPES,
    ChatImagePartParam,
    InputFilePartParam,
    InputImagePartParam,
    RefusalPartParam,
    TextPartParam,
)
from ._json import join
from ._media import MediaPolicy, parse_detail

__all__ = [
    "IMAGE_PART_TYPES",
    "TEXT_PART_TYPES",
    "PartList",
    "add_message_part",
    "add_tool_output_part",
    "hold",
]

# A contract message's repeated parts, filled in place.
PartList = RepeatedCompositeFieldContainer[pb.Part]


def hold(held: HeldTexts | None, text: str) -> str:
    """What a message gets for a client's text: with `held`, a long one stays the client's
    string (held there, a marker in the message): upb would hold it once more, and its reading
    for the request's bytes once again (docs/hardening.md, "Memory per request byte")."""
    return text if held is None else held.hold(text)


def add_message_part(
    parts: PartList, part: Any, path: str, media: MediaPolicy, held: HeldTexts | None = None
) -> None:
    """A validated part of a message item's `content`, added to `parts` (a file may add several)."""
    if isinstance(part, RefusalPartParam):
        parts.add().text.text = hold(held, part.refusal)
        return
    _add_known_part(parts, part, path, media, held)


def add_tool_output_part(
    parts: PartList, part: Any, path: str, media: MediaPolicy, held: HeldTexts | None = None
) -> None:
    """A validated part of a tool output array, added to `parts`; a part of another kind is
    kept as its JSON."""
    if isinstance(part, dict):
        parts.add().json.json = json.dumps(part, ensure_ascii=False)
        return
    _add_known_part(parts, part, path, media, held)


def _add_known_part(
    parts: PartList, part: Any, path: str, media: MediaPolicy, held: HeldTexts | None
) -> None:
    # Built where it stays: protobuf copies a message put into another, so a part made apart
    # and then added would hold a 30 MiB text two or three times (docs/hardening.md).
    if isinstance(part, TextPartParam):
        parts.add().text.text = hold(held, part.text)
    elif isinstance(part, InputImagePartParam):
        parts.add().image.CopyFrom(_input_image(part, path, media))
    elif isinstance(part, ChatImagePartParam):
        parts.add().image.CopyFrom(_chat_image_url(part, path, media))
    elif isinstance(part, InputFilePartParam):
        parts.extend(input_file_parts(part, path, media))
    elif isinstance(part, InputVideoPartParam | ChatVideoURLPartParam | VideoPartParam):
        parts.add().video.CopyFrom(video_part(part, path, media, media.video_defaults))
    elif isinstance(part, InputAudioPartParam | AudioURLPartParam):
        parts.add().audio.CopyFrom(audio_part(part, path, media))
    else:
        # Validation refuses every other kind; nothing is dropped if that ever changes.
        raise InvalidRequestError(f"Invalid value for '{join(path, 'type')}'.", param=join(path, "type"))


def _input_image(part: InputImagePartParam, path: str, media: MediaPolicy) -> pb.ImagePart:
    detail = parse_detail(part.detail, join(path, "detail"))
    if part.image_url is not None and part.file_id is not None:
        raise InvalidRequestError(
            f"Invalid value for '{path}': send either 'image_url' or 'file_id', not both.",
            param=path,
            code="invalid_value",
        )
    if part.image_url is None:
        if part.file_id is not None:
            return file_image(part.file_id, detail, path, media)
        raise InvalidRequestError(
            f"Missing required parameter: '{join(path, 'image_url')}' (a base64 data: URL or a file_id).",
            param=join(path, "image_url"),
            code="missing_required_parameter",
        )
    return media.load_image(part.image_url, detail, param=join(path, "image_url"))


def _chat_image_url(part: ChatImagePartParam, path: str, media: MediaPolicy) -> pb.ImagePart:
    """Chat-completions alias: `image_url` is `{url, detail}` or a plain string."""
    url_path = join(path, "image_url")
    if isinstance(part.image_url, str):
        detail = parse_detail(part.detail, join(path, "detail"))
        return media.load_image(part.image_url, detail, param=url_path)
    inner = part.image_url
    detail = (
        parse_detail(inner.detail, join(url_path, "detail"))
        if inner.detail is not None
        else parse_detail(part.detail, join(path, "detail"))
    )
    return media.load_image(inner.url, detail, param=join(url_path, "url"))
