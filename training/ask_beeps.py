"""Ask a running vlmserve facade how many beeps it hears (the README's audio demo).

    make run MODEL=models/beeps-audio &   # engine + facade on the hearing fixture
    make demo DEMO=beeps                  # writes beeps.wav, asks, prints expected and answer

The clip goes as a Responses `input_audio` part; only the standard library talks to the server.
"""

from __future__ import annotations

import argparse
import base64
import json
import random
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from training.beeps import AUDIO_QUESTION, draw_clip


def ask(url: str, wav: bytes, timeout: float = 60) -> str:
    """POST /v1/responses with the clip and the question; return the model's text."""
    body = {
        "model": "default",
        "input": [
            {
                "role": "user",
                "content": [
                    {
                        "type": "input_audio",
                        "input_audio": {"data": base64.b64encode(wav).decode(), "format": "wav"},
                    },
                    {"type": "input_text", "text": AUDIO_QUESTION},
                ],
            }
        ],
        "max_output_tokens": 16,
    }
    request = urllib.request.Request(
        url.rstrip("/") + "/v1/responses",
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as response:
        result: dict[str, Any] = json.load(response)
    return "".join(
        part.get("text", "")
        for item in result.get("output", [])
        if item.get("type") == "message"
        for part in item.get("content", [])
        if part.get("type") == "output_text"
    )


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
