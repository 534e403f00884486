"""The squares-click task (issue 35, models/squares-click/README.md): click the named colour's
square on a screen the model has to ask for.

A screen is D x D pixels (D in SCREEN_SIZES), white, a 4x4 grid of D/4-px cells, 2-4 squares of
different palette colours in different cells. Asked "Click the <colour> square." with the
computer tool offered and no screenshot, the model takes one; given it, it clicks the centre of
that square's cell (always inside the square: a square covers at least 18/28 of its cell around
the centre); after a click and the next screenshot it says DONE_TEXT. Its clicks are in Qwen2-VL's
convention (0-1000 across the screenshot), which the engine maps to the D x D screen.

The conversations here are contract requests as the facade sends them (a ComputerTool, computer
calls in screen pixels, screenshots as computer-call outputs), so training renders them through
the engine's own computer adapter, lowering and chat template.
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from PIL import Image

from training.squares import GRID, PALETTE, encode_png
from vlmserve.engine.v1 import engine_pb2 as pb

SCREEN_SIZES = (112, 224, 336)
MIN_SQUARES = 2
MAX_SQUARES = 4
# A square's side and its place in the cell, in 1/28ths of the cell (the squares task's 18-24 px
# squares in 28 px cells): every square covers its cell's centre.
MIN_SIDE_28THS = 18
MAX_SIDE_28THS = 24
CELL_28THS = 28
BACKGROUND = (255, 255, 255)
DONE_TEXT = "Done."
CALL_IDS = ("call_screenshot", "call_click")


def prompt_for(colour: str) -> str:
    return f"Click the {colour} square."


@dataclass(frozen=True)
class ClickSquare:
    colour: str
    cell: int
    x: int
    y: int
    side: int

    def contains(self, x: int, y: int) -> bool:
        return self.x <= x < self.x + self.side and self.y <= y < self.y + self.side


@dataclass(frozen=True)
class Screen:
    image: Image.Image
    size: int
    squares: tuple[ClickSquare, ...]
    target: str  # the colour asked for

    @property
    def target_square(self) -> ClickSquare:
        return next(square for square in self.squares if square.colour == self.target)

    @property
    def target_cell(self) -> int:
        return self.target_square.cell

    def png_bytes(self) -> bytes:
        return encode_png(self.image)

    def blank_png(self) -> bytes:
        """The control: a white screen of the same size."""
        return encode_png(Image.new("RGB", (self.size, self.size), BACKGROUND))


def draw_screen(
    rng: random.Random, size: int | None = None, target: str | None = None, count: int | None = None
) -> Screen:
    """A screen; `count` squares (default: MIN_SQUARES to MAX_SQUARES; training's warm-up draws one)."""
    size = size if size is not None else rng.choice(SCREEN_SIZES)
    cell = size // GRID
    count = count if count is not None else rng.randint(MIN_SQUARES, MAX_SQUARES)
    colours = sorted(PALETTE)
    if target is None:
        chosen = rng.sample(colours, count)
        target = rng.choice(chosen)
    else:
        chosen = [target, *rng.sample([c for c in colours if c != target], count - 1)]
    cells = rng.sample(range(GRID * GRID), count)
    image = Image.new("RGB", (size, size), BACKGROUND)
    squares = []
    for colour, index in zip(chosen, cells, strict=True):
        side = cell * rng.randint(MIN_SIDE_28THS, MAX_SIDE_28THS) // CELL_28THS
        row, col = divmod(index, GRID)
        x = col * cell + rng.randint(0, cell - side)
        y = row * cell + rng.randint(0, cell - side)
        image.paste(PALETTE[colour], (x, y, x + side, y + side))
        squares.append(ClickSquare(colour, index, x, y, side))
    return Screen(image=image, size=size, squares=tuple(squares), target=target)


def cell_centre_relative(cell: int) -> tuple[int, int]:
    """The cell's centre on Qwen2-VL's 0-1000 scale (what the model writes)."""
    row, col = divmod(cell, GRID)
    step = 1000 // GRID
    return col * step + step // 2, row * step + step // 2


# -- contract conversations -------------------------------------------------------------------


def computer_tool(display: int = 0) -> pb.Tool:
    """The Responses `computer` tool (display 0) or a sized one (`computer_use_preview`, Anthropic)."""
    return pb.Tool(computer=pb.ComputerTool(display_width=display, display_height=display))


def screenshot_call() -> pb.ToolCall:
    return pb.ToolCall(
        id=CALL_IDS[0],
        name="computer",
        arguments=json.dumps({"type": "screenshot"}),
        kind=pb.TOOL_KIND_COMPUTER,
    )


def click_call(x: int, y: int) -> pb.ToolCall:
    action = {"type": "click", "button": "left", "x": x, "y": y}
    return pb.ToolCall(
        id=CALL_IDS[1], name="computer", arguments=json.dumps(action), kind=pb.TOOL_KIND_COMPUTER
    )


def screenshot_output(call_id: str, png: bytes) -> pb.Message:
    output = pb.ToolOutput(call_id=call_id, kind=pb.TOOL_KIND_COMPUTER)
    output.parts.parts.append(pb.Part(image=pb.ImagePart(data=png, media_type="image/png")))
    return pb.Message(role=pb.ROLE_TOOL, tool_output=output)


def first_turn(colour: str) -> list[pb.Message]:
    return [pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text=prompt_for(colour)))])]


def second_turn(colour: str, png: bytes) -> list[pb.Message]:
    return [
        *first_turn(colour),
        pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[screenshot_call()]),
        screenshot_output(CALL_IDS[0], png),
    ]


def third_turn(colour: str, png: bytes, click: tuple[int, int], after_png: bytes) -> list[pb.Message]:
    return [
        *second_turn(colour, png),
        pb.Message(role=pb.ROLE_ASSISTANT, tool_calls=[click_call(*click)]),
        screenshot_output(CALL_IDS[1], after_png),
    ]
