"""What the `make demo` scripts share (training/ask_squares.py, ask_beeps.py, ask_video.py): one
POST to /v1/responses, and the command line that draws a sample from a seed, saves it, asks the
facade and prints the expected and the given answer.

Only the standard library talks to the server, so the demos run with the client install too.
"""

from __future__ import annotations

import argparse
import json
import random
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class DemoSample:
    """A drawn sample: the bytes saved and sent (PNG, WAV, MP4) and the answer it has."""

    data: bytes
    expected: str


def responses_text(url: str, content: list[dict[str, Any]], *, max_output_tokens: int, timeout: float) -> str:
    """POST one user message of `content` parts to /v1/responses; the answer's text."""
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


def run_demo(
    argv: Sequence[str] | None,
    *,
    description: str | None,
    noun: str,
    default_save: Path,
    draw: Callable[[int], DemoSample],
    ask: Callable[[str, bytes], str],
) -> None:
    """The demo's command line: `--url`, `--seed` (random if absent), `--save`; prints the saved
    `noun` (image, clip) with its seed, the expected answer and the model's."""
    parser = argparse.ArgumentParser(description=description, allow_abbrev=False)
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="the facade's base URL")
    parser.add_argument("--seed", type=int, default=None, help=f"{noun} seed (default: random)")
    parser.add_argument("--save", type=Path, default=default_save, help=f"where to write the {noun}")
    args = parser.parse_args(argv)
    seed = args.seed if args.seed is not None else random.SystemRandom().randrange(1 << 30)
    sample = draw(seed)
    args.save.write_bytes(sample.data)
    print(f"{noun + ':':<10}{args.save} (seed {seed})")
    print(f"expected: {sample.expected}")
    print(f"model:    {ask(args.url, sample.data)}")
