"""Ask a running vlmserve facade how many beeps it hears (the README's audio demo).

    make run MODEL=models/beeps-audio &   # engine + facade on the hearing fixture
    make demo DEMO=beeps                  # writes beeps.wav, asks, prints expected and answer

The clip goes as a Responses `input_audio` part; only the standard library talks to the server.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from training.beeps import AUDIO_QUESTION, draw_clip
from training.demo_client import DemoSample, responses_text, run_demo


def ask(url: str, wav: bytes, timeout: float = 60) -> str:
    """POST /v1/responses with the clip and the question; return the model's text."""
    clip: dict[str, Any] = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"},
    }
    content: list[dict[str, Any]] = [clip, {"type": "input_text", "text": AUDIO_QUESTION}]
    return responses_text(url, content, max_output_tokens=16, timeout=timeout)


def draw(seed: int) -> DemoSample:
    clip = draw_clip(random.Random(seed))
    return DemoSample(clip.wav_bytes(), clip.answer)


def main(argv: Sequence[str] | None = None) -> None:
    description = __doc__.splitlines()[0] if __doc__ else None
    run_demo(argv, description=description, noun="clip", default_save=Path("beeps.wav"), draw=draw, ask=ask)


if __name__ == "__main__":
    main()
