"""MP3 and Ogg Vorbis voice notes on the chat `input_audio` path (OpenAI's {data, format}), real
encodings (libsndfile through soundfile, LAME for MP3): the engine gets the bytes as sent with
their media type; what the engine cannot decode (Ogg Opus, M4A) is a 400 naming the field here."""

from __future__ import annotations

import io
import random
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import soundfile  # type: ignore[import-untyped]  # no stubs

from tests._clips import b64
from tests.facade.fake_engine import FakeEngine
from training.beeps import SAMPLE_RATE, draw_clip

CLIP = draw_clip(random.Random(3), count=3)
M4A = Path(__file__).resolve().parents[1] / "data" / "clips" / "tone.m4a"


def encoded(format: str, subtype: str, samples: np.ndarray = CLIP.samples) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, SAMPLE_RATE, format=format, subtype=subtype)
    return buffer.getvalue()


MP3 = encoded("MP3", "MPEG_LAYER_III")
OGG = encoded("OGG", "VORBIS")


async def chat(http: httpx.AsyncClient, part: dict[str, Any]) -> httpx.Response:
    content = [{"type": "text", "text": "How many beeps, and are they high or low?"}, part]
    return await http.post(
        "/v1/chat/completions", json={"model": "default", "messages": [{"role": "user", "content": content}]}
    )


@pytest.mark.parametrize(
    ("data", "format", "media_type"),
    [(MP3, "mp3", "audio/mpeg"), (OGG, "ogg", "audio/ogg")],
    ids=["mp3", "ogg"],
)
async def test_mp3_and_ogg_voice_notes_reach_the_engine(
    http: httpx.AsyncClient, engine: FakeEngine, data: bytes, format: str, media_type: str
) -> None:
    answer = await chat(http, {"type": "input_audio", "input_audio": {"data": b64(data), "format": format}})
    assert answer.status_code == 200, answer.text
    (message,) = engine.requests[0].messages
    assert [part.WhichOneof("kind") for part in message.parts] == ["text", "audio"]
    assert (message.parts[1].audio.data, message.parts[1].audio.media_type) == (data, media_type)


# (case, bytes, declared format, the param, the code)
REFUSED: list[tuple[str, bytes, str, str, str]] = [
    ("mp3 bytes said to be ogg", MP3, "ogg", "format", "invalid_value"),
    ("ogg bytes said to be mp3", OGG, "mp3", "format", "invalid_value"),
    # Ogg, but Opus: the engine decodes Vorbis only (it was sent on and failed there before).
    ("ogg opus", encoded("OGG", "OPUS"), "ogg", "data", "unsupported_audio_format"),
    ("m4a", M4A.read_bytes(), "mp3", "data", "unsupported_audio_format"),
]


@pytest.mark.parametrize(
    ("data", "format", "field", "code"), [r[1:] for r in REFUSED], ids=[r[0] for r in REFUSED]
)
async def test_audio_the_engine_cannot_decode_is_a_400(
    http: httpx.AsyncClient, engine: FakeEngine, data: bytes, format: str, field: str, code: str
) -> None:
    answer = await chat(http, {"type": "input_audio", "input_audio": {"data": b64(data), "format": format}})
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    param = f"messages[0].content[1].input_audio.{field}"
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", param, code)
    assert engine.requests == []
    if code == "unsupported_audio_format":
        assert "Ogg Vorbis" in error["message"]
