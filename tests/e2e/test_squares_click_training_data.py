"""The squares-click training data (training/squares_click_batches.py) is what inference sees,
on the fixture's architecture with fresh weights (no training, no server).

- every screen size becomes the same 4 x 4 image tokens, one per cell: the 0-1000 answer needs
  no knowledge of D;
- each cell's click is the `computer` function call at that cell's centre, and the cells'
  replies differ only in the coordinates' digits (what `--digit-weight` weights);
- the training forward (shared prefix, deepstack, selected logits) equals mlx-vlm's own forward
  on every kind of turn.
"""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

from training.squares import GRID
from training.squares_batches import Tokens
from training.squares_click import SCREEN_SIZES, cell_centre_relative, draw_screen
from training.squares_click_batches import (
    DISPLAYS,
    Templates,
    click_batch,
    done_batch,
    first_batch,
    mixed_short_batch,
)
from training.squares_click_model import build_click_base
from training.squares_forward import check_against_model
from vlmserve.engine.computer.conventions import convention_for

pytestmark = pytest.mark.needs_model


@pytest.fixture(scope="module")
def templates(tmp_path_factory: pytest.TempPathFactory) -> Templates:
    from mlx_vlm.utils import load

    base: Path = build_click_base(tmp_path_factory.mktemp("click-base") / "model")
    model, processor = load(str(base))
    assert model.config.model_type == "qwen3_vl"
    return Templates(Tokens(model, processor), convention_for(model.config.model_type))


@pytest.mark.parametrize("size", SCREEN_SIZES)
def test_every_screen_is_one_image_token_per_cell(templates: Templates, size: int) -> None:
    processor: Any = templates.tokens.processor
    processed = processor.image_processor(images=[Image.new("RGB", (size, size), (255, 255, 255))])
    merge = processor.image_processor.merge_size
    grid = np.asarray(processed["image_grid_thw"]).reshape(-1).tolist()
    assert grid == templates.grid
    assert [grid[0], grid[1] // merge, grid[2] // merge] == [1, GRID, GRID]
    template = templates.second("red", 0)
    assert int((template.prompt_ids == templates.tokens.image_token_id).sum()) == GRID * GRID


def test_each_cells_click_is_its_centre(templates: Templates) -> None:
    tokenizer = templates.tokens.tokenizer
    for cell, ids in templates.click_ids.items():
        text = tokenizer.decode(list(ids))
        match = re.fullmatch(r"<tool_call>\n(.*)\n</tool_call><\|im_end\|>", text, re.S)
        assert match, text
        call = json.loads(match.group(1))
        assert call == {
            "name": "computer",
            "arguments": {"action": "left_click", "coordinate": list(cell_centre_relative(cell))},
        }
    reply = templates.click_ids[0]
    digits = [tokenizer.decode([reply[slot]]) for slot in templates.deciding_slots]
    assert all(digit.isdigit() for digit in digits), digits


@pytest.mark.parametrize("variant", DISPLAYS)
def test_training_forward_equals_mlx_vlms(templates: Templates, variant: int) -> None:
    rng = random.Random(35)
    screens = [draw_screen(rng, size, "blue") for size in (112, 336)]
    model = templates.tokens.model
    click = templates.second("blue", variant)
    assert check_against_model(model, *click_batch(templates, click, screens)) < 1e-3
    done = templates.third("blue", variant, 6)
    assert check_against_model(model, *done_batch(templates, done, screens)) < 1e-3
    assert check_against_model(model, *first_batch(templates, templates.first("blue", variant))) < 1e-3


def test_mixed_colour_short_batch_equals_mlx_vlms(templates: Templates) -> None:
    """`--mix-colours`: each row its own colour's short turn (prompts of different lengths, only
    the first token shared), each row's logits those of mlx-vlm's forward on that row alone."""
    rng = random.Random(36)
    colours = ("red", "purple", "blue", "yellow")  # colour words of 2, 4, 3 and 4 tokens
    sizes = (112, 224, 336, 112)
    screens = [draw_screen(rng, size, colour) for size, colour in zip(sizes, colours, strict=True)]
    batch, full = mixed_short_batch(templates, screens, digit_weight=5.0)
    assert len({len(templates.short(colour).prompt_ids) for colour in colours}) > 1
    assert check_against_model(templates.tokens.model, batch, full) < 1e-3
    weights = np.array(batch.loss_weight).reshape(len(screens), -1)
    assert sorted(set(weights[0].tolist())) == [1.0, 5.0]
    assert [k for k, w in enumerate(weights[0]) if w == 5.0] == templates.deciding_slots


@pytest.mark.parametrize("variant", DISPLAYS)
def test_untooled_turn_is_the_loop_turn_after_its_tools_block(templates: Templates, variant: int) -> None:
    """`--untooled-share`: the loop's second turn without the tools block is the same tokens from
    the request on, so relative positions (all rotary sees) match the loop's; mixed colours in a
    batch equal mlx-vlm's forward row by row."""
    untooled = templates.untooled("green", variant).prompt_ids
    loop = templates.second("green", variant).prompt_ids
    assert len(untooled) < len(loop) // 5
    assert (loop[-(len(untooled) - 1) :] == untooled[1:]).all()
    rng = random.Random(37)
    screens = [draw_screen(rng, size, colour) for size, colour in ((112, "orange"), (336, "green"))]
    batch, full = mixed_short_batch(templates, screens, untooled=[variant, variant])
    assert check_against_model(templates.tokens.model, batch, full) < 1e-3


@pytest.mark.parametrize("variant", DISPLAYS)
def test_prefixed_turn_puts_the_tools_blocks_tail_before_the_request(
    templates: Templates, variant: int
) -> None:
    """`--prefix-max`: the untooled turn with the last N tokens before the loop's request put
    back: N = 0 is the untooled turn, N = all the loop's second turn (and their M-RoPE
    positions the model's own), every N the loop's tokens from the request on; a batch of rows
    with different colours and N equals mlx-vlm's forward row by row."""
    untooled = templates.untooled("red", variant)
    loop = templates.second("red", variant)
    limit = templates.prefix_limit("red", variant)
    assert limit == len(loop.prompt_ids) - len(untooled.prompt_ids) > 900
    for mine, theirs in (
        (templates.prefixed("red", variant, 0), untooled),
        (templates.prefixed("red", variant, limit), loop),
    ):
        assert (mine.prompt_ids == theirs.prompt_ids).all()
        assert (mine.positions == theirs.positions).all()
        assert mine.split == theirs.split
    middle = templates.prefixed("red", variant, 300).prompt_ids
    assert len(middle) == len(untooled.prompt_ids) + 300
    assert middle[0] == loop.prompt_ids[0] and (middle[1:] == loop.prompt_ids[-(len(middle) - 1) :]).all()
    with pytest.raises(ValueError):
        templates.prefixed("red", variant, limit + 1)
    rng = random.Random(38)
    picks = ((112, "orange", 0), (336, "green", 17), (224, "purple", 300))
    screens = [draw_screen(rng, size, colour) for size, colour, _ in picks]
    prefix = [n for _, _, n in picks]
    batch, full = mixed_short_batch(templates, screens, 5.0, untooled=[variant] * 3, prefix=prefix)
    assert check_against_model(templates.tokens.model, batch, full) < 1e-3
    with pytest.raises(ValueError):
        mixed_short_batch(templates, screens, prefix=prefix)
