"""Ask a running vlmserve facade how many squares it sees (the README's one-command demo).

    make run &                      # engine + facade on the default (squares) model
    python -m training.ask_squares  # draws an image, asks, prints the expected and the model's answer

Only the standard library talks to the server, so it runs with the client install too.
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

from training.squares import QUESTION, make_sample


def ask(url: str, png: bytes, timeout: float = 60) -> str:
    """POST /v1/responses with the image and the question; return the model's text."""
    image_url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    content = [{"type": "input_text", "text": QUESTION}, {"type": "input_image", "image_url": image_url}]
    return responses_text(url, content, max_output_tokens=32, timeout=timeout)


def responses_text(url: str, content: list[dict[str, Any]], *, max_output_tokens: int, timeout: float) -> str:
    """POST one user message of `content` parts to /v1/responses; the answer's text (the demos')."""
    body = {
        "model": "default",
        "input": [{"role": "user", "content": content}],
        "max_output_tokens": max_output_tokens,
        # Greedy: the demo asks for the answer the model is surest of. The default (the model's
        # generation config, else mlx-vlm's 1.0) samples, and a sampled count can miss by one
        # (seen in CI: 18/20 clips).
        "temperature": 0,
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
    parser.add_argument("--seed", type=int, default=None, help="image seed (default: random)")
    parser.add_argument("--save", type=Path, default=Path("squares.png"), help="where to write the image")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    sample = make_sample(seed)
    args.save.write_bytes(sample.png_bytes())
    print(f"image:    {args.save} (seed {seed})")
    print(f"expected: {sample.answer}")
    print(f"model:    {ask(args.url, sample.png_bytes())}")


if __name__ == "__main__":
    main()
