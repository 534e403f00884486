"""Ask a running vlmserve facade how many squares it sees (the README's one-command demo).

    make run &                      # engine + facade on the default (squares) model
    python -m training.ask_squares  # draws an image, asks, prints the expected and the model's answer

Only the standard library talks to the server, so it runs with the client install too.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from pathlib import Path

from training.demo_client import DemoSample, responses_text, run_demo
from training.squares import QUESTION, make_sample


def ask(url: str, png: bytes, timeout: float = 60) -> str:
    """POST /v1/responses with the image and the question; return the model's text."""
    image_url = "data:image/png;base64," + base64.b64encode(png).decode("ascii")
    content = [{"type": "input_text", "text": QUESTION}, {"type": "input_image", "image_url": image_url}]
    return responses_text(url, content, max_output_tokens=32, timeout=timeout)


def draw(seed: int) -> DemoSample:
    sample = make_sample(seed)
    return DemoSample(sample.png_bytes(), sample.answer)


def main(argv: Sequence[str] | None = None) -> None:
    description = __doc__.splitlines()[0] if __doc__ else None
    save = Path("squares.png")
    run_demo(argv, description=description, noun="image", default_save=save, draw=draw, ask=ask)


if __name__ == "__main__":
    main()
