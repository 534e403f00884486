"""Ask a running vlmserve facade what colours a moving square has, in order (the README's video demo).

    make run MODEL=models/squares-video &   # engine + facade on the motion fixture
    make demo DEMO=video                    # writes squares.mp4, asks, prints expected and answer

The clip (4, 6 or 8 frames at 2 fps, training/squares_video.py) goes as an MP4 in a Responses
`input_video` part; only the standard library talks to the server.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from training.demo_client import DemoSample, responses_text, run_demo
from training.squares_video import VIDEO_QUESTION, draw_clip


def ask(url: str, mp4: bytes, timeout: float = 60) -> str:
    """POST /v1/responses with the clip and the question; return the model's text."""
    video_url = "data:video/mp4;base64," + base64.b64encode(mp4).decode("ascii")
    clip: dict[str, Any] = {"type": "input_video", "video_url": video_url}
    content: list[dict[str, Any]] = [clip, {"type": "input_text", "text": VIDEO_QUESTION}]
    return responses_text(url, content, max_output_tokens=16, timeout=timeout)


def draw(seed: int) -> DemoSample:
    clip = draw_clip(random.Random(seed))
    return DemoSample(clip.mp4_bytes(), clip.answer)


def main(argv: Sequence[str] | None = None) -> None:
    description = __doc__.splitlines()[0] if __doc__ else None
    run_demo(argv, description=description, noun="clip", default_save=Path("squares.mp4"), draw=draw, ask=ask)


if __name__ == "__main__":
    main()
