"""What the facade sends for a clip is what the engine decodes (issue 34.2 meets 34.4): a real MP4
(OpenCV-encoded here) and a real WAV go in as chat and Responses JSON, the scripted engine keeps
the contract parts, and the engine's own bounded decoder (`vlmserve.engine.media`) reads them with
the sampling the request asked for. Decoding runs in worker processes, hence the marker."""

from __future__ import annotations

import base64
from pathlib import Path

import cv2
import httpx
import numpy as np
import pytest

from tests._clips import wav_bytes
from tests.facade.fake_engine import FakeEngine
from vlmserve.engine.media import MediaLimits, decode_audio, decode_video

pytestmark = pytest.mark.needs_model

COLOURS = [(230, 20, 20), (230, 20, 20), (20, 20, 230), (20, 20, 230)]  # 2 s at 2 fps: red, then blue


def mp4(directory: Path) -> bytes:
    path = directory / "clip.mp4"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), 2.0, (64, 64))
    assert writer.isOpened()
    for colour in COLOURS:
        writer.write(np.full((64, 64, 3), colour[::-1], dtype=np.uint8))
    writer.release()
    return path.read_bytes()


def mean_colour(frame: np.ndarray) -> tuple[int, ...]:
    return tuple(int(value) for value in frame.reshape(-1, 3).mean(axis=0))


async def test_chat_and_responses_clips_decode_with_the_sampling_asked(
    http: httpx.AsyncClient, engine: FakeEngine, tmp_path: Path
) -> None:
    clip = base64.b64encode(mp4(tmp_path)).decode("ascii")
    wav = wav_bytes(seconds=0.5, rate=22_050)
    chat = await http.post(
        "/v1/chat/completions",
        json={
            "model": "default",
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "video_url",
                            "video_url": {"url": f"data:video/mp4;base64,{clip}"},
                            "fps": 1,
                        },
                        {
                            "type": "input_audio",
                            "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"},
                        },
                    ],
                }
            ],
        },
    )
    assert chat.status_code == 200, chat.text
    responses = await http.post(
        "/v1/responses",
        json={
            "model": "default",
            "input": [
                {
                    "role": "user",
                    "content": [{"type": "input_video", "video_url": f"data:video/mp4;base64,{clip}"}],
                }
            ],
            "mm_processor_kwargs": {"max_frames": 1},
        },
    )
    assert responses.status_code == 200, responses.text

    video, audio = engine.requests[0].messages[0].parts
    decoded = decode_video(video.video, MediaLimits())
    # 1 fps over a 2 s clip: two frames, the red half then the blue half.
    assert decoded.frames.shape[0] == 2
    first, last = (mean_colour(frame) for frame in decoded.frames)
    assert first[0] > 150 > first[2] and last[2] > 150 > last[0]
    sound = decode_audio(audio.audio, MediaLimits())
    assert sound.sample_rate == 16_000
    assert sound.duration_s == pytest.approx(0.5, abs=0.05)

    only = decode_video(engine.requests[1].messages[0].parts[0].video, MediaLimits())
    assert only.frames.shape[0] == 1  # the request's max_frames
