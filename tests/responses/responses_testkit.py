"""Tiny images and builders shared by the tests/responses tests."""

from __future__ import annotations

import io
from typing import Any

from PIL import Image

from tests._data_urls import data_url
from vlmserve.engine.v1 import engine_pb2 as pb


def image_bytes(
    color: tuple[int, int, int] = (255, 0, 0), size: tuple[int, int] = (4, 4), fmt: str = "PNG"
) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, color).save(buffer, fmt)
    return buffer.getvalue()


RED = image_bytes((255, 0, 0))
GREEN = image_bytes((0, 255, 0))
BLUE = image_bytes((0, 0, 255))
RED_URL = data_url(RED)
GREEN_URL = data_url(GREEN)
BLUE_URL = data_url(BLUE)


def input_text(text: str) -> dict[str, Any]:
    return {"type": "input_text", "text": text}


def input_image(url: str = RED_URL, detail: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "input_image", "image_url": url}
    if detail is not None:
        part["detail"] = detail
    return part


def message(role: str, content: Any) -> dict[str, Any]:
    return {"type": "message", "role": role, "content": content}


def function_call(call_id: str = "c1", name: str = "screenshot", arguments: Any = "{}") -> dict[str, Any]:
    return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}


def function_output(output: Any, call_id: str = "c1") -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": call_id, "output": output}


def text_part(text: str) -> pb.Part:
    return pb.Part(text=pb.TextPart(text=text))


def image_part(data: bytes = RED, detail: pb.ImageDetail.ValueType = pb.IMAGE_DETAIL_AUTO) -> pb.Part:
    return pb.Part(image=pb.ImagePart(data=data, media_type="image/png", detail=detail))


def json_part(json_text: str) -> pb.Part:
    return pb.Part(json=pb.JsonPart(json=json_text))


def images_of(message: pb.Message) -> list[bytes]:
    return [part.image.data for part in message.parts if part.WhichOneof("kind") == "image"]


def texts_of(message: pb.Message) -> list[str]:
    return [part.text.text for part in message.parts if part.WhichOneof("kind") == "text"]
