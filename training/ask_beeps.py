"""Ask a running vlmserve facade how many beeps it hears (the README's audio demo).

    make run MODEL=models/beeps-audio &   # engine + facade on the hearing fixture
    make demo DEMO=beeps                  # writes beeps.wav, asks, prints expected and answer

The clip goes as a Responses `input_audio` part; only the standard library talks to the server.
"""

from __future__ import annotations

import argparse
import base64
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from training.ask_squares import responses_text
from training.beeps import AUDIO_QUESTION, draw_clip


def ask(url: str, wav: bytes, timeout: float = 60) -> str:
    """POST /v1/responses with the clip and the question; return the model's text."""
    clip: dict[str, Any] = {
        "type": "input_audio",
        "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"},
    }
    content: list[dict[str, Any]] = [clip, {"type": "input_text", "text": AUDIO_QUESTION}]
    return responses_text(url, content, max_output_tokens=16, timeout=timeout)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the facade's base URL")
    parser.add_argument("--seed", type=int, default=None, help="clip seed (default: random)")
    parser.add_argument("--save", type=Path, default=Path("beeps.wav"), help="where to write the clip")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    clip = draw_clip(random.Random(seed))
    wav = clip.wav_bytes()
    args.save.write_bytes(wav)
    print(f"clip:     {args.save} (seed {seed})")
    print(f"expected: {clip.answer}")
    print(f"model:    {ask(args.url, wav)}")


if __name__ == "__main__":
    main()
