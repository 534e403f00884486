"""The squares task: N solid squares of one colour on a white grid (models/qwen2-vl-squares/README.md).

A model cannot guess the answer (chance 1/36), so a correct `"<N> <colour>"` proves the image
reached it. These constants are fixed: training, tests and the README all depend on them.
"""

from __future__ import annotations

import io
import random
from dataclasses import dataclass

from PIL import Image

IMAGE_SIZE = 112
GRID = 4
CELL = IMAGE_SIZE // GRID  # 28 px
MIN_SQUARES = 2
MAX_SQUARES = 7
MIN_SIDE = 18
MAX_SIDE = 24
BACKGROUND = (255, 255, 255)

PALETTE: dict[str, tuple[int, int, int]] = {
    "red": (220, 30, 30),
    "green": (30, 160, 40),
    "blue": (30, 60, 220),
    "yellow": (230, 210, 20),
    "purple": (140, 40, 170),
    "orange": (240, 130, 20),
}

QUESTION = "How many squares are there, and what colour are they?"
AGENT_PROMPT = "Take a screenshot and tell me how many squares there are and what colour they are."
NO_IMAGE_ANSWER = "no image"


@dataclass(frozen=True)
class Square:
    """One filled square: top-left corner (x, y) and side, in pixels."""

    cell: int
    x: int
    y: int
    side: int


@dataclass(frozen=True)
class SquaresSample:
    image: Image.Image
    count: int
    colour: str
    squares: tuple[Square, ...]

    @property
    def answer(self) -> str:
        return answer_for(self.count, self.colour)

    def png_bytes(self) -> bytes:
        return encode_png(self.image)


def answer_for(count: int, colour: str) -> str:
    return f"{count} {colour}"


def encode_png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def draw_sample(rng: random.Random) -> SquaresSample:
    """Draw one task instance from `rng` (advances it)."""
    count = rng.randint(MIN_SQUARES, MAX_SQUARES)
    colour = rng.choice(sorted(PALETTE))
    cells = rng.sample(range(GRID * GRID), count)
    image = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), BACKGROUND)
    squares = []
    for cell in sorted(cells):
        side = rng.randint(MIN_SIDE, MAX_SIDE)
        row, col = divmod(cell, GRID)
        x = col * CELL + rng.randint(0, CELL - side)
        y = row * CELL + rng.randint(0, CELL - side)
        # paste's box end is exclusive: exactly side x side pixels.
        image.paste(PALETTE[colour], (x, y, x + side, y + side))
        squares.append(Square(cell=cell, x=x, y=y, side=side))
    return SquaresSample(image=image, count=count, colour=colour, squares=tuple(squares))


def make_sample(seed: int) -> SquaresSample:
    """The sample for one integer seed: the same seed always gives the same image."""
    return draw_sample(random.Random(seed))


def make_samples(seed: int, n: int) -> list[SquaresSample]:
    """`n` samples from one seeded stream (for test sets: e.g. `make_samples(1234, 50)`)."""
    rng = random.Random(seed)
    return [draw_sample(rng) for _ in range(n)]
