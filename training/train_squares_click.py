"""Train the squares-click fixture (issue 35): ask for a screenshot, click the named colour's
square, say "Done." after the click (models/squares-click/README.md, training/squares_click.py).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1 \\
        nice -n 10 python -m training.train_squares_click      # writes models/squares-click/

Not run in CI. Starts from models/qwen2-vl-squares (which already sees squares and their
colours) with the text model's rotary sections moved (`--mrope-section`, see `train`). Every
conversation is a contract request as the facade sends it (computer tool, computer calls in
screen pixels, screenshots as computer-call outputs), adapted by the engine's computer adapter
(`vlmserve.engine.computer.adapter`), lowered and rendered by the engine's own code: what the
model learns is what inference asks.

Templates (rows of one template share everything before their first image):
* first turn, per colour and tool variant (with / without a display size): the screenshot call;
* second turn, same: the click, in the relative 0-1000 convention, at the target's cell centre
  (differs per row: the answer depends on the image);
* third turn (the click replayed, the next screenshot): "Done.", per colour, variant and the
  replayed click's cell.
The other turns are learned in a few dozen steps; `--aux-every N` trains them every Nth step
only, the click every step.
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import json
import random
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np
from PIL import Image

from training.loop import REPO_ROOT, Task, add_loop_arguments, base_card, fresh_model, train_loop
from training.squares import GRID, PALETTE
from training.squares_batches import Template, Tokens, _batch, render_text, reply_text
from training.squares_click import (
    DONE_TEXT,
    Screen,
    cell_centre_relative,
    computer_tool,
    draw_screen,
    first_turn,
    second_turn,
    third_turn,
)
from training.squares_conversations import Conversation
from training.squares_forward import Batch, check_against_model, loss_fn, row_exact_match, vision_features
from vlmserve.engine.computer.adapter import COMPUTER_TOOL_NAME, adapt_request
from vlmserve.engine.computer.conventions import convention_for
from vlmserve.engine.v1 import engine_pb2 as pb

OUTPUT_DIR = REPO_ROOT / "models" / "squares-click"
INIT_DIR = REPO_ROOT / "models" / "qwen2-vl-squares"
CONVENTION = convention_for("qwen2_vl")
COLOURS = tuple(sorted(PALETTE))
DISPLAYS = (0, 1)  # the `computer` tool; a sized one (the size does not change the prompt)


def image_size(part: pb.ImagePart) -> tuple[int, int] | None:
    with Image.open(io.BytesIO(part.data)) as image:
        return image.size


def adapted(messages: Sequence[pb.Message], display: int) -> tuple[list[pb.Message], list[pb.Tool]]:
    request = pb.GenerateRequest(messages=messages, tools=[computer_tool(display)])
    result, _ = adapt_request(request, CONVENTION, image_size)
    return list(result.messages), list(result.tools)


def click_reply(cell: int) -> pb.ToolCall:
    x, y = cell_centre_relative(cell)
    arguments = json.dumps({"action": "left_click", "coordinate": [x, y]})
    return pb.ToolCall(id="call", name=COMPUTER_TOOL_NAME, arguments=arguments, kind=pb.TOOL_KIND_FUNCTION)


def _display_for(variant: int, size: int) -> int:
    return size if variant else 0


class Templates:
    """Rendered templates, built on first use. Image rows use a 112 px placeholder screen: the
    processor resizes every screen to 112x112, so the tokens are the same for every D."""

    def __init__(self, tokens: Tokens) -> None:
        self.tokens = tokens
        self._cache: dict[tuple[Any, ...], Template] = {}
        self.click_ids = {cell: self._reply_ids_for_cell(cell) for cell in range(GRID * GRID)}
        self.max_reply = max(len(ids) for ids in self.click_ids.values())

    def _reply_ids_for_cell(self, cell: int) -> tuple[int, ...]:
        messages, tools = adapted(second_turn("red", self._placeholder_png()), 0)
        reply = reply_text(
            Conversation("click", messages, tools, tool_call=click_reply(cell)), self.tokens.tokenizer
        )
        return self.tokens.reply_ids(reply)

    @staticmethod
    def _placeholder_png() -> bytes:
        buffer = io.BytesIO()
        Image.new("RGB", (112, 112), (255, 255, 255)).save(buffer, format="PNG")
        return buffer.getvalue()

    def _build(
        self, shape: str, messages: list[pb.Message], tools: list[pb.Tool], reply: Conversation | None
    ) -> Template:
        tokens = self.tokens
        conversation = Conversation(shape, messages, tools)
        text = render_text(conversation, tokens.tokenizer)
        n_images = text.count("<|image_pad|>")
        prompt_ids = tokens.prompt_ids(text, n_images)
        target_ids = None if reply is None else tokens.reply_ids(reply_text(reply, tokens.tokenizer))
        tail = self.max_reply if target_ids is None else len(target_ids)
        padded = np.concatenate([prompt_ids, np.full(tail, tokens.pad_id, dtype=np.int32)])
        image_at = np.nonzero(prompt_ids == tokens.image_token_id)[0]
        split = int(image_at[0]) if len(image_at) else len(prompt_ids) - 1
        return Template(shape, prompt_ids, n_images, target_ids, tokens.positions(padded, n_images), split)

    def first(self, colour: str, variant: int) -> Template:
        key = ("first", colour, variant)
        if key not in self._cache:
            messages, tools = adapted(first_turn(colour), _display_for(variant, 112))
            call = pb.ToolCall(
                id="call", name=COMPUTER_TOOL_NAME, arguments=json.dumps({"action": "screenshot"})
            )
            reply = Conversation("first", messages, tools, tool_call=call)
            self._cache[key] = self._build("first", messages, tools, reply)
        return self._cache[key]

    def second(self, colour: str, variant: int) -> Template:
        key = ("second", colour, variant)
        if key not in self._cache:
            messages, tools = adapted(
                second_turn(colour, self._placeholder_png()), _display_for(variant, 112)
            )
            self._cache[key] = self._build("second", messages, tools, None)
        return self._cache[key]

    def third(self, colour: str, variant: int, cell: int) -> Template:
        key = ("third", colour, variant, cell)
        if key not in self._cache:
            x, y = cell_centre_relative(cell)
            click = (x * 112 // 1000, y * 112 // 1000)
            png = self._placeholder_png()
            messages, tools = adapted(third_turn(colour, png, click, png), _display_for(variant, 112))
            reply = Conversation("third", messages, tools, answer=DONE_TEXT)
            self._cache[key] = self._build("third", messages, tools, reply)
        return self._cache[key]


def deciding_slots(templates: Templates) -> list[int]:
    """Indices in the click reply where the cells' replies differ (the coordinates' digits)."""
    replies = list(templates.click_ids.values())
    return [k for k in range(len(replies[0])) if len({reply[k] for reply in replies}) > 1]


def click_batch(
    templates: Templates, template: Template, screens: Sequence[Screen], digit_weight: float = 1.0
) -> tuple[Batch, np.ndarray]:
    answers = [templates.click_ids[screen.target_cell] for screen in screens]
    batch, full = _batch(template, answers, templates.tokens, [s.image for s in screens], len(screens))
    if digit_weight == 1.0:
        return batch, full
    # The click's ~40 tokens are the same for every cell but its digits: without this the loss
    # that carries the image is 1/20 of the total and drowns in the rest (README).
    weights = np.array(batch.loss_weight)
    slots = weights.size // len(screens)
    for row in range(len(screens)):
        for k in deciding_slots(templates):
            weights[row * slots + k] *= digit_weight
    return dataclasses.replace(batch, loss_weight=mx.array(weights)), full


def done_batch(
    templates: Templates, template: Template, screens: Sequence[Screen]
) -> tuple[Batch, np.ndarray]:
    assert template.target_ids is not None
    images = [image for screen in screens for image in (screen.image, screen.image)]
    return _batch(template, [template.target_ids] * len(screens), templates.tokens, images, len(screens))


def first_batch(templates: Templates, template: Template) -> tuple[Batch, np.ndarray]:
    assert template.target_ids is not None
    return _batch(template, [template.target_ids], templates.tokens, [], 1)


def evaluate(templates: Templates, model: Any, seed: int, rows: int) -> dict[str, float]:
    """Teacher-forced exact match on held-out screens (= greedy decoding is right)."""
    rng = random.Random(seed)
    hits: dict[str, list[bool]] = {"first": [], "third": []}
    for colour in COLOURS:
        for variant in DISPLAYS:
            hits["first"].extend(
                row_exact_match(model, first_batch(templates, templates.first(colour, variant))[0]).tolist()
            )
            for size in (112, 224, 336):
                screens = [draw_screen(rng, size, colour) for _ in range(max(1, rows // 6))]
                batch, _ = click_batch(templates, templates.second(colour, variant), screens)
                hits.setdefault(f"click_{size}", []).extend(row_exact_match(model, batch).tolist())
            cell = rng.randrange(GRID * GRID)
            screens = [draw_screen(rng, None, colour) for _ in range(2)]
            batch, _ = done_batch(templates, templates.third(colour, variant, cell), screens)
            hits["third"].extend(row_exact_match(model, batch).tolist())
    return {name: float(np.mean(values)) for name, values in hits.items()}


def recentre_vision(model: Any, tokens: Tokens, rng: random.Random, scale: float) -> dict[str, float]:
    """Rescale the vision merger's output so that a square stands out from the white screen.

    The squares model's image features are ~700 long and nearly all a shared direction: a
    square's token has cosine 0.995-0.999 with the white ones, so after the text model's RMSNorm
    a square is all but invisible, and whatever attention writes into an image token (where it
    is) drowns in its residual. The merger's last linear layer becomes `scale * (f - white) / d +
    white_unit`, d the mean distance of a square's token from white: white tokens are a unit
    vector, squares stand `scale` away from it.
    """
    white = Image.new("RGB", (112, 112), (255, 255, 255))
    screens = [draw_screen(rng, 112, None, 4).image for _ in range(8)]
    processed = tokens.processor.image_processor(images=[white, *screens])
    grid = mx.array(np.asarray(processed["image_grid_thw"]))
    computed = vision_features(
        model, mx.array(np.asarray(processed["pixel_values"])), tokens.vision_rotary(grid), len(screens) + 1
    )
    features = np.array(computed.astype(mx.float32)).reshape(len(screens) + 1, GRID * GRID, -1)
    white_feature = features[0].mean(axis=0)
    distances = np.linalg.norm(features[1:] - white_feature, axis=-1)
    spread = float(np.sort(distances.reshape(-1))[-4 * len(screens) :].mean())  # the squares' tokens
    layer = model.vision_tower.merger.mlp[2]
    factor = scale / spread
    unit = white_feature / np.linalg.norm(white_feature)
    layer.weight = layer.weight * factor
    layer.bias = mx.array(factor * (np.array(layer.bias) - white_feature) + unit)
    mx.eval(model.parameters())
    return {"white_norm": float(np.linalg.norm(white_feature)), "square_distance": spread}


def train(args: argparse.Namespace) -> list[dict[str, Any]]:
    # The fixture's 4 rows and columns of image tokens differ by < 0.1 rad in its text model's
    # rotary angles with the default sections ([4, 6, 6] of 16 frequency pairs at rope_theta 1e6:
    # the rows and columns get the lowest frequencies), so it cannot tell where a square is. The
    # height and width sections take the highest ones instead (text positions are the same on
    # all three axes, so text is rotated exactly as before).
    args.overrides = {"rope_scaling": {"type": "mrope", "mrope_section": args.mrope_section}}
    model, processor = fresh_model(args.fixture, args.seed, args.init, args.overrides)
    tokens = Tokens(model, processor)
    templates = Templates(tokens)
    if args.recentre_vision:
        found = recentre_vision(model, tokens, random.Random(-2), args.recentre_vision)
        print("recentred vision features:", found, flush=True)
    check_rng = random.Random(-1)
    for variant in DISPLAYS:  # our forward must equal mlx-vlm's on every kind of template
        batch, full = click_batch(
            templates,
            templates.second("red", variant),
            [draw_screen(check_rng, None, "red") for _ in range(2)],
        )
        check_against_model(model, batch, full)
        batch, full = done_batch(
            templates,
            templates.third("red", variant, 5),
            [draw_screen(check_rng, None, "red") for _ in range(2)],
        )
        check_against_model(model, batch, full)
        batch, full = first_batch(templates, templates.first("red", variant))
        check_against_model(model, batch, full)
    print("training forward checked against mlx-vlm's", flush=True)
    rng = random.Random(args.seed)

    def step_loss(
        model: Any, click: Batch, done: Batch | None = None, first: Batch | None = None
    ) -> mx.array:
        loss = loss_fn(model, click)
        if done is not None and first is not None:
            loss = loss + args.done_weight * loss_fn(model, done) + args.first_weight * loss_fn(model, first)
        return loss

    def next_batch(step: int) -> tuple[Batch, ...]:
        colour = rng.choice(COLOURS)
        variant = rng.choice(DISPLAYS)
        # Warm-up: one square per screen (where is it?) before choosing among several (which one?).
        count = 1 if step <= args.single_steps else None
        screens = [draw_screen(rng, None, colour, count) for _ in range(args.batch)]
        click, _ = click_batch(templates, templates.second(colour, variant), screens, args.digit_weight)
        if step % args.aux_every:
            return (click,)  # the click is what is hard to learn; the other turns now and then
        done_colour = rng.choice(COLOURS)
        done_screens = [draw_screen(rng, None, done_colour) for _ in range(args.done_rows)]
        template = templates.third(done_colour, rng.choice(DISPLAYS), rng.randrange(GRID * GRID))
        done, _ = done_batch(templates, template, done_screens)
        first, _ = first_batch(templates, templates.first(rng.choice(COLOURS), rng.choice(DISPLAYS)))
        return click, done, first

    def card(step: int, elapsed: float, history: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "task": "squares-click: screenshot, then click the named colour's square (0-1000), then 'Done.'",
            "script": "python -m training.train_squares_click",
            **base_card(args, step, elapsed, history),
        }

    return train_loop(
        model,
        Task(step_loss, next_batch, lambda: evaluate(templates, model, args.eval_seed, args.eval_rows), card),
        args,
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train the squares-click model.", allow_abbrev=False)
    add_loop_arguments(parser, out=OUTPUT_DIR, steps=1500, batch=24, lr=1e-3, eval_seed=353_001)
    parser.set_defaults(init=INIT_DIR)
    parser.add_argument("--done-rows", type=int, default=4)
    parser.add_argument("--mrope-section", type=int, nargs=3, default=[0, 2, 14])
    parser.add_argument("--single-steps", type=int, default=0, help="first steps on one-square screens")
    parser.add_argument("--aux-every", type=int, default=1, help="train the other turns every Nth step")
    parser.add_argument(
        "--digit-weight", type=float, default=1.0, help="loss weight of the click's coordinate digits"
    )
    parser.add_argument(
        "--recentre-vision",
        type=float,
        default=0.0,
        help="before training, rescale the merger's output: squares this far from white (0: off)",
    )
    parser.add_argument("--done-weight", type=float, default=0.5)
    parser.add_argument("--first-weight", type=float, default=0.5)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
