"""Content parts (spec §2) -> contract parts, on message items and inside tool outputs."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from vlmserve.engine.v1 import engine_pb2 as pb

from ._errors import InvalidRequestError
from ._json import as_object, join, optional_str, required_str, wrong_type
from ._media import MediaPolicy, parse_detail

TEXT_PART_TYPES = ("input_text", "text", "output_text")
IMAGE_PART_TYPES = ("input_image", "image_url")

# Parts with a known meaning that we cannot serve yet: refused by name wherever they appear.
_UNSUPPORTED_PARTS = {
    "input_file": (
        "input_file parts are not supported yet; send images as input_image parts with a base64 "
        "data: URL and documents as input_text"
    ),
    "file": "file parts are not supported yet; send documents as input_text",
    "input_audio": "audio input is not supported by this server; send text or images",
    "video_url": "video input is not supported by this server; send text or images",
    "input_video": "video input is not supported by this server; send text or images",
}


def parse_message_part(part: object, path: str, media: MediaPolicy) -> pb.Part:
    """A part of a message item's `content`; an unknown part type is a 400."""
    obj, part_type = _typed(part, path)
    if part_type == "refusal":
        return pb.Part(text=pb.TextPart(text=required_str(obj, "refusal", path)))
    known = _parse_known(obj, part_type, path, media)
    if known is None:
        raise InvalidRequestError(
            f"Invalid value for '{join(path, 'type')}': unsupported content part type; supported: "
            "input_text, input_image, text, image_url, output_text, refusal.",
            param=join(path, "type"),
            code="invalid_value",
        )
    return known


def parse_tool_output_part(part: object, path: str, media: MediaPolicy) -> pb.Part:
    """A part of a tool output array; an unknown part is kept as its JSON (rule 3.2)."""
    obj = as_object(part, path)
    part_type = obj.get("type")
    known = _parse_known(obj, part_type, path, media) if isinstance(part_type, str) else None
    if known is not None:
        return known
    return pb.Part(json=pb.JsonPart(json=json.dumps(obj, ensure_ascii=False)))


def _typed(part: object, path: str) -> tuple[Mapping[str, Any], str]:
    obj = as_object(part, path)
    return obj, required_str(obj, "type", path)


def _parse_known(obj: Mapping[str, Any], part_type: str, path: str, media: MediaPolicy) -> pb.Part | None:
    if part_type in TEXT_PART_TYPES:
        return pb.Part(text=pb.TextPart(text=required_str(obj, "text", path)))
    if part_type == "input_image":
        return pb.Part(image=_input_image(obj, path, media))
    if part_type == "image_url":
        return pb.Part(image=_chat_image_url(obj, path, media))
    if part_type in _UNSUPPORTED_PARTS:
        raise InvalidRequestError(
            _UNSUPPORTED_PARTS[part_type] + ".", param=join(path, "type"), code="unsupported_value"
        )
    return None


def _input_image(obj: Mapping[str, Any], path: str, media: MediaPolicy) -> pb.ImagePart:
    detail = parse_detail(obj.get("detail"), join(path, "detail"))
    url = optional_str(obj, "image_url", path)
    if url is None:
        if optional_str(obj, "file_id", path) is not None:
            raise InvalidRequestError(
                f"Invalid value for '{join(path, 'file_id')}': input_image by file_id is not supported "
                "(this server has no files store); send the image inline as a base64 data: URL in "
                "'image_url'.",
                param=join(path, "file_id"),
                code="unsupported_value",
            )
        raise InvalidRequestError(
            f"Missing required parameter: '{join(path, 'image_url')}' (a base64 data: URL).",
            param=join(path, "image_url"),
            code="missing_required_parameter",
        )
    return media.load_image(url, detail, param=join(path, "image_url"))


def _chat_image_url(obj: Mapping[str, Any], path: str, media: MediaPolicy) -> pb.ImagePart:
    """Chat-completions alias: `image_url` is `{url, detail}` or a plain string."""
    value = obj.get("image_url")
    url_path = join(path, "image_url")
    if isinstance(value, str):
        detail = parse_detail(obj.get("detail"), join(path, "detail"))
        return media.load_image(value, detail, param=url_path)
    if value is None:
        raise InvalidRequestError(
            f"Missing required parameter: '{url_path}'.", param=url_path, code="missing_required_parameter"
        )
    if not isinstance(value, Mapping):
        raise wrong_type(url_path, "an object with 'url' or a string", value)
    url = required_str(value, "url", url_path)
    inner = value.get("detail")
    detail = (
        parse_detail(inner, join(url_path, "detail"))
        if inner is not None
        else parse_detail(obj.get("detail"), join(path, "detail"))
    )
    return media.load_image(url, detail, param=join(url_path, "url"))
