"""The squares task generator: geometry, colours and determinism (fixed constants:
models/qwen2-vl-squares/README.md)."""

from __future__ import annotations

import io
from collections import Counter

import pytest
from PIL import Image

from training import squares

SEEDS = [0, 1, 2, 3, 7, 42, 1234, 99991]


def rgb_pixels(image: Image.Image) -> list[tuple[int, int, int]]:
    raw = image.tobytes()
    return [(raw[i], raw[i + 1], raw[i + 2]) for i in range(0, len(raw), 3)]


def test_constants_are_the_issues() -> None:
    assert squares.QUESTION == "How many squares are there, and what colour are they?"
    assert squares.AGENT_PROMPT == (
        "Take a screenshot and tell me how many squares there are and what colour they are."
    )
    assert squares.NO_IMAGE_ANSWER == "no image"
    assert squares.PALETTE == {
        "red": (220, 30, 30),
        "green": (30, 160, 40),
        "blue": (30, 60, 220),
        "yellow": (230, 210, 20),
        "purple": (140, 40, 170),
        "orange": (240, 130, 20),
    }
    assert (squares.IMAGE_SIZE, squares.GRID, squares.CELL) == (112, 4, 28)


@pytest.mark.parametrize("seed", SEEDS)
def test_squares_sit_inside_distinct_cells(seed: int) -> None:
    sample = squares.make_sample(seed)
    assert 2 <= sample.count <= 7
    assert len(sample.squares) == sample.count
    assert len({sq.cell for sq in sample.squares}) == sample.count
    for sq in sample.squares:
        row, col = divmod(sq.cell, 4)
        assert 18 <= sq.side <= 24
        assert col * 28 <= sq.x and sq.x + sq.side <= (col + 1) * 28
        assert row * 28 <= sq.y and sq.y + sq.side <= (row + 1) * 28


@pytest.mark.parametrize("seed", SEEDS)
def test_pixels_are_white_or_the_one_palette_colour(seed: int) -> None:
    sample = squares.make_sample(seed)
    image = sample.image
    assert image.mode == "RGB" and image.size == (112, 112)
    pixels = Counter(rgb_pixels(image))
    colour = squares.PALETTE[sample.colour]
    assert set(pixels) == {(255, 255, 255), colour}
    assert pixels[colour] == sum(sq.side**2 for sq in sample.squares)
    for sq in sample.squares:
        assert image.getpixel((sq.x, sq.y)) == colour
        assert image.getpixel((sq.x + sq.side - 1, sq.y + sq.side - 1)) == colour


@pytest.mark.parametrize(
    ("count", "colour", "answer"),
    [(2, "red", "2 red"), (3, "red", "3 red"), (7, "purple", "7 purple"), (5, "orange", "5 orange")],
)
def test_answer_format(count: int, colour: str, answer: str) -> None:
    assert squares.answer_for(count, colour) == answer


@pytest.mark.parametrize("seed", SEEDS)
def test_same_seed_same_sample(seed: int) -> None:
    first, second = squares.make_sample(seed), squares.make_sample(seed)
    assert first.answer == second.answer == f"{first.count} {first.colour}"
    assert first.squares == second.squares
    assert first.png_bytes() == second.png_bytes()


def test_png_round_trips() -> None:
    sample = squares.make_sample(5)
    decoded = Image.open(io.BytesIO(sample.png_bytes()))
    assert decoded.format == "PNG"
    assert decoded.convert("RGB").tobytes() == sample.image.tobytes()


def test_stream_covers_every_count_and_colour() -> None:
    samples = squares.make_samples(2024, 400)
    assert {s.count for s in samples} == set(range(2, 8))
    assert {s.colour for s in samples} == set(squares.PALETTE)
    assert len({s.answer for s in samples}) == 36
    # different seeds give different streams
    assert [s.answer for s in squares.make_samples(1, 20)] != [s.answer for s in squares.make_samples(2, 20)]
