"""Training batches for the squares-click fixture: each turn of the computer-use loop rendered
as inference renders it, its rows differing only in their screens and the click.

A *template* is one turn as a contract request (training/squares_click.py) adapted by the
engine's computer adapter (`vlmserve.engine.computer.adapter`: the computer tool becomes the
model's `computer` function, screen pixels become the family's convention), lowered, rendered
by the model's chat template and tokenised by mlx-vlm's `prepare_inputs`. Every screen becomes
the same image grid (the processor's min_pixels = max_pixels), so a template's token ids hold
for every D and are rendered once. A batch is `training.squares_forward.Batch`: the prompt up
to its first image runs once and is shared by the rows (the tools block makes it ~1000 tokens
of the ~1100), checked against the model's own forward (`squares_forward.check_against_model`).

Templates (rows of one template share their prompt):
* first turn, per colour and tool variant (with / without a display size): the screenshot call;
* second turn, same: the click at the target's cell centre (differs per row);
* third turn (the click replayed, the next screenshot): "Done.", per colour, variant and the
  replayed click's cell;
* the pre-stage's short turn, per colour: the screen and the request in one user message, no
  tools, the same click (training/train_squares_click.py `--pre-steps`).
"""

from __future__ import annotations

import io
import json
import random
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import mlx.core as mx
import numpy as np
from PIL import Image

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
from training.squares_forward import Batch, answer_logits, row_exact_match
from vlmserve.engine.computer.adapter import COMPUTER_TOOL_NAME, adapt_request
from vlmserve.engine.computer.conventions import Convention
from vlmserve.engine.v1 import engine_pb2 as pb

COLOURS = tuple(sorted(PALETTE))
DISPLAYS = (0, 1)  # the `computer` tool; a sized one (the size does not change the prompt)
PLACEHOLDER_SIZE = 112
SCREEN_SIZES_EVAL = (112, 224, 336)


def image_size(part: pb.ImagePart) -> tuple[int, int] | None:
    with Image.open(io.BytesIO(part.data)) as image:
        return image.size


def click_reply(cell: int) -> pb.ToolCall:
    x, y = cell_centre_relative(cell)
    arguments = json.dumps({"action": "left_click", "coordinate": [x, y]})
    return pb.ToolCall(id="call", name=COMPUTER_TOOL_NAME, arguments=arguments, kind=pb.TOOL_KIND_FUNCTION)


def _placeholder() -> Image.Image:
    return Image.new("RGB", (PLACEHOLDER_SIZE, PLACEHOLDER_SIZE), (255, 255, 255))


def _placeholder_png() -> bytes:
    buffer = io.BytesIO()
    _placeholder().save(buffer, format="PNG")
    return buffer.getvalue()


class Templates:
    """The loop's turns for one model and convention, rendered on first use."""

    def __init__(self, tokens: Tokens, convention: Convention) -> None:
        self.tokens = tokens
        self.convention = convention
        # Every screen's grid (the processor brings every D to one size).
        processed = tokens.processor.image_processor(images=[_placeholder()])
        self.grid = np.asarray(processed["image_grid_thw"]).reshape(-1).tolist()
        self._cache: dict[tuple[Any, ...], Template] = {}
        self.click_ids = {cell: self._click_ids(cell) for cell in range(GRID * GRID)}
        replies = list(self.click_ids.values())
        if len({len(reply) for reply in replies}) != 1:
            raise AssertionError("every cell's click must be the same number of tokens")
        self.max_reply = len(replies[0])
        # Where the cells' clicks differ: the coordinates' digits.
        self.deciding_slots = [k for k in range(self.max_reply) if len({r[k] for r in replies}) > 1]

    def adapted(self, messages: Sequence[pb.Message], display: int) -> tuple[list[pb.Message], list[pb.Tool]]:
        request = pb.GenerateRequest(messages=messages, tools=[computer_tool(display)])
        result, _ = adapt_request(request, self.convention, image_size)
        return list(result.messages), list(result.tools)

    def _click_ids(self, cell: int) -> tuple[int, ...]:
        messages, tools = self.adapted(second_turn("red", _placeholder_png()), 0)
        reply = Conversation("click", messages, tools, tool_call=click_reply(cell))
        return self.tokens.reply_ids(reply_text(reply, self.tokens.tokenizer))

    def _positions(self, ids: np.ndarray, n_images: int) -> np.ndarray:
        """M-RoPE positions (3, len) by the model's own code."""
        grid = mx.array([self.grid] * n_images) if n_images else None
        positions, _ = self.tokens.model.language_model.get_rope_index(
            mx.array(ids[None, :]), grid, None, None
        )
        positions = np.array(positions)
        if positions.ndim == 2:  # text only: one sequence shared by the three sections
            positions = np.broadcast_to(positions[None], (3, *positions.shape))
        return np.asarray(positions[:, 0, :])

    def _build(
        self, shape: str, messages: list[pb.Message], tools: list[pb.Tool], reply: Conversation | None
    ) -> Template:
        tokens = self.tokens
        text = render_text(Conversation(shape, messages, tools), tokens.tokenizer)
        n_images = text.count("<|image_pad|>")
        prompt_ids = tokens.prompt_ids(text, n_images)
        target_ids = None if reply is None else tokens.reply_ids(reply_text(reply, tokens.tokenizer))
        tail = self.max_reply if target_ids is None else len(target_ids)
        padded = np.concatenate([prompt_ids, np.full(tail, tokens.pad_id, dtype=np.int32)])
        image_at = np.nonzero(prompt_ids == tokens.image_token_id)[0]
        split = int(image_at[0]) if len(image_at) else len(prompt_ids) - 1
        return Template(shape, prompt_ids, n_images, target_ids, self._positions(padded, n_images), split)

    def first(self, colour: str, variant: int) -> Template:
        key = ("first", colour, variant)
        if key not in self._cache:
            messages, tools = self.adapted(first_turn(colour), variant * PLACEHOLDER_SIZE)
            arguments = json.dumps({"action": "screenshot"})
            call = pb.ToolCall(id="call", name=COMPUTER_TOOL_NAME, arguments=arguments)
            reply = Conversation("first", messages, tools, tool_call=call)
            self._cache[key] = self._build("first", messages, tools, reply)
        return self._cache[key]

    def short(self, colour: str) -> Template:
        """The pre-stage's turn: the screen and the request in one user message, no tools (~40
        prompt tokens against the loop's ~1100); the same click as the loop's second turn."""
        key = ("short", colour)
        if key not in self._cache:
            image = pb.Part(image=pb.ImagePart(data=_placeholder_png(), media_type="image/png"))
            text = first_turn(colour)[0].parts[0]
            messages = [pb.Message(role=pb.ROLE_USER, parts=[text, image])]
            self._cache[key] = self._build("short", messages, [], None)
        return self._cache[key]

    def untooled(self, colour: str, variant: int) -> Template:
        """The loop's second turn without its tools block: the same tokens from the request on
        (the colour word as far before the image, the image as far before the click), so what is
        learnt here by relative position holds in the loop; ~60 prompt tokens, not ~1100."""
        key = ("untooled", colour, variant)
        if key not in self._cache:
            turn = second_turn(colour, _placeholder_png())
            messages, _ = self.adapted(turn, variant * PLACEHOLDER_SIZE)
            self._cache[key] = self._build("untooled", messages, [], None)
        return self._cache[key]

    def prefix_limit(self, colour: str, variant: int) -> int:
        """How many tokens stand between the loop prompt's first token and the request: the most
        `prefixed` puts back (then its prompt is the loop's second turn)."""
        return len(self.second(colour, variant).prompt_ids) - len(self.untooled(colour, variant).prompt_ids)

    def prefixed(self, colour: str, variant: int, prefix: int) -> Template:
        """The untooled turn with the last `prefix` tokens of what precedes the request in the
        loop (the tools block, the system turn's end) put back between its first token and the
        request: 0 is `untooled`, `prefix_limit` the loop's second turn. From the request on the
        tokens and their relative positions are the loop's; only the request's distance from
        the sequence's start changes, so a model trained on every `prefix` cannot find the
        colour word by where it stands from the start (models/squares-click/README.md)."""
        loop = self.second(colour, variant).prompt_ids
        limit = self.prefix_limit(colour, variant)
        if not 0 <= prefix <= limit:
            raise ValueError(f"prefix {prefix} outside 0..{limit}")
        ids = np.concatenate([loop[:1], loop[limit - prefix + 1 :]])
        padded = np.concatenate([ids, np.full(self.max_reply, self.tokens.pad_id, dtype=np.int32)])
        split = int(np.nonzero(ids == self.tokens.image_token_id)[0][0])
        return Template("prefixed", ids, 1, None, self._positions(padded, 1), split)

    def second(self, colour: str, variant: int) -> Template:
        key = ("second", colour, variant)
        if key not in self._cache:
            turn = second_turn(colour, _placeholder_png())
            messages, tools = self.adapted(turn, variant * PLACEHOLDER_SIZE)
            self._cache[key] = self._build("second", messages, tools, None)
        return self._cache[key]

    def third(self, colour: str, variant: int, cell: int) -> Template:
        key = ("third", colour, variant, cell)
        if key not in self._cache:
            x, y = cell_centre_relative(cell)
            click = (x * PLACEHOLDER_SIZE // 1000, y * PLACEHOLDER_SIZE // 1000)
            png = _placeholder_png()
            turn = third_turn(colour, png, click, png)
            messages, tools = self.adapted(turn, variant * PLACEHOLDER_SIZE)
            reply = Conversation("third", messages, tools, answer=DONE_TEXT)
            self._cache[key] = self._build("third", messages, tools, reply)
        return self._cache[key]


def click_batch(
    templates: Templates, template: Template, screens: Sequence[Screen], digit_weight: float = 1.0
) -> tuple[Batch, np.ndarray]:
    """The click for each screen (and the full rows, for checks). `digit_weight` multiplies the
    coordinates' digits in the loss: the click's ~50 tokens are the same for every cell but
    those, so unweighted the part of the loss that needs the screen is a small share of it."""
    answers = [templates.click_ids[screen.target_cell] for screen in screens]
    batch, full = _batch(template, answers, templates.tokens, [s.image for s in screens], len(screens))
    if digit_weight == 1.0:
        return batch, full
    weights = np.array(batch.loss_weight)
    slots = weights.size // len(screens)
    for row in range(len(screens)):
        weights[[row * slots + k for k in templates.deciding_slots]] *= digit_weight
    return replace(batch, loss_weight=mx.array(weights)), full


def done_batch(
    templates: Templates, template: Template, screens: Sequence[Screen]
) -> tuple[Batch, np.ndarray]:
    assert template.target_ids is not None
    images = [image for screen in screens for image in (screen.image, screen.image)]
    return _batch(template, [template.target_ids] * len(screens), templates.tokens, images, len(screens))


def first_batch(templates: Templates, template: Template) -> tuple[Batch, np.ndarray]:
    assert template.target_ids is not None
    return _batch(template, [template.target_ids], templates.tokens, [], 1)


def digit_probe(templates: Templates, model: Any, rng: random.Random, rows: int) -> dict[str, float]:
    """Share of one-square screens whose click's first x and y digits are the argmax, teacher
    forced: where it is, before which of several (chance: a quarter each)."""
    slots = templates.deciding_slots
    picks = {"probe_x": slots[0], "probe_y": slots[len(slots) // 2]}
    hits: dict[str, list[bool]] = {name: [] for name in picks}
    for colour in COLOURS:
        screens = [draw_screen(rng, None, colour, 1) for _ in range(max(1, rows // len(COLOURS)))]
        batch, _ = click_batch(templates, templates.second(colour, 0), screens)
        predicted = np.array(mx.argmax(answer_logits(model, batch), axis=-1))
        targets = np.array(batch.targets)
        per_row = predicted.size // len(screens)
        for name, slot in picks.items():
            at = [row * per_row + slot for row in range(len(screens))]
            hits[name].extend((predicted[at] == targets[at]).tolist())
    return {name: float(np.mean(values)) for name, values in hits.items()}


def evaluate(templates: Templates, model: Any, seed: int, rows: int) -> dict[str, float]:
    """Teacher-forced exact match on held-out screens (= greedy decoding is right), per turn and
    per D for the click, and the digit probe."""
    rng = random.Random(seed)
    hits: dict[str, list[bool]] = {"first": [], "third": []}
    for colour in COLOURS:
        for variant in DISPLAYS:
            batch, _ = first_batch(templates, templates.first(colour, variant))
            hits["first"].extend(row_exact_match(model, batch).tolist())
            for size in SCREEN_SIZES_EVAL:
                screens = [draw_screen(rng, size, colour) for _ in range(max(1, rows // 6))]
                batch, _ = click_batch(templates, templates.second(colour, variant), screens)
                hits.setdefault(f"click_{size}", []).extend(row_exact_match(model, batch).tolist())
            screens = [draw_screen(rng, None, colour) for _ in range(max(1, rows // 6))]
            batch, _ = click_batch(templates, templates.short(colour), screens)
            hits.setdefault("short", []).extend(row_exact_match(model, batch).tolist())
            cell = rng.randrange(GRID * GRID)
            screens = [draw_screen(rng, None, colour) for _ in range(2)]
            batch, _ = done_batch(templates, templates.third(colour, variant, cell), screens)
            hits["third"].extend(row_exact_match(model, batch).tolist())
    found = {name: float(np.mean(values)) for name, values in hits.items()}
    return {
        **found,
        **digit_probe(templates, model, rng, rows),
        **prefixed_click(templates, model, rng, rows),
    }


def prefixed_click(templates: Templates, model: Any, rng: random.Random, rows: int) -> dict[str, float]:
    """The click on the prefixed turn (mixed colours, N drawn from 0 to all of the tools block,
    so from the untooled turn to the loop's): whether the colour word is found wherever the
    request stands from the sequence's start."""
    hits: list[bool] = []
    for _ in range(max(1, rows // 16)):
        screens = [draw_screen(rng, None, rng.choice(COLOURS)) for _ in range(16)]
        variants = [rng.choice(DISPLAYS) for _ in screens]
        prefix = [
            rng.randint(0, templates.prefix_limit(s.target, v))
            for s, v in zip(screens, variants, strict=True)
        ]
        batch, _ = mixed_short_batch(templates, screens, untooled=variants, prefix=prefix)
        hits.extend(row_exact_match(model, batch).tolist())
    return {"prefixed": float(np.mean(hits))}


def mixed_short_batch(
    templates: Templates,
    screens: Sequence[Screen],
    digit_weight: float = 1.0,
    untooled: Sequence[int] | None = None,
    prefix: Sequence[int] | None = None,
) -> tuple[Batch, np.ndarray]:
    """The short turn's click for screens of different target colours in one batch.

    One colour per batch (the loop turns, whose ~1100-token prefix is shared) makes every step's
    gradient about one colour word; here each row is its own colour's short template, so a step
    asks the colour match of all of them. The short prompts differ in length (a colour is 2-4
    tokens), so only the first token is shared: rows are right-padded (causal attention: padding
    after a row's reply changes none of its logits) and keep their own M-RoPE positions.
    `untooled`: per row, the tool variant of `Templates.untooled` instead of the short turn;
    with `prefix`, per row the tokens of `Templates.prefixed` put back before its request.
    """
    rows = len(screens)
    if prefix is not None and untooled is None:
        raise ValueError("prefix needs untooled (the tool variant of each row)")
    row_templates = [
        templates.short(screen.target)
        if untooled is None
        else templates.untooled(screen.target, variant)
        if prefix is None
        else templates.prefixed(screen.target, variant, n)
        for screen, variant, n in zip(screens, untooled or [0] * rows, prefix or [0] * rows, strict=True)
    ]
    answers = [templates.click_ids[screen.target_cell] for screen in screens]
    width = max(len(t.prompt_ids) for t in row_templates) + templates.max_reply
    pad_id = templates.tokens.pad_id
    full = np.full((rows, width), pad_id, dtype=np.int32)
    positions = np.zeros((3, rows, width), dtype=np.int32)
    split = 1  # `<|im_start|>`, the same in every row
    suffix_len = width - split
    slots = templates.max_reply
    loss_index = np.zeros(rows * slots, dtype=np.int32)
    loss_row = np.repeat(np.arange(rows, dtype=np.int32), slots)
    targets = np.zeros(rows * slots, dtype=np.int32)
    weights = np.zeros(rows * slots, dtype=np.float32)
    for row, (template, answer) in enumerate(zip(row_templates, answers, strict=True)):
        prompt_len = len(template.prompt_ids)
        full[row, :prompt_len] = template.prompt_ids
        full[row, prompt_len : prompt_len + len(answer)] = answer
        known = template.positions.shape[1]
        positions[:, row, :known] = template.positions
        positions[:, row, known:] = template.positions[:, -1:] + np.arange(1, width - known + 1)
        for k, token in enumerate(answer):
            slot = row * slots + k
            loss_index[slot] = row * suffix_len + (prompt_len - 1 + k - split)
            targets[slot] = token
            weights[slot] = digit_weight if k in templates.deciding_slots else 1.0
    if len({int(full[row, 0]) for row in range(rows)}) != 1:
        raise AssertionError("the short turns must share their first token")
    suffix = full[:, split:]
    processed = templates.tokens.processor.image_processor(images=[screen.image for screen in screens])
    is_image = suffix.reshape(-1) == templates.tokens.image_token_id
    index = np.arange(suffix.size)
    index[is_image] = suffix.size + np.arange(int(is_image.sum()))
    batch = Batch(
        prefix_ids=mx.array(full[:1, :split]),
        prefix_positions=mx.array(positions[:, :1, :split]),
        suffix_ids=mx.array(suffix),
        suffix_positions=mx.array(positions[:, :, split:]),
        pixel_values=mx.array(np.asarray(processed["pixel_values"])),
        image_grid_thw=mx.array(np.asarray(processed["image_grid_thw"])),
        vision_rotary=None,
        embed_index=mx.array(index),
        loss_index=mx.array(loss_index),
        targets=mx.array(targets),
        loss_row=mx.array(loss_row),
        loss_weight=mx.array(weights),
    )
    return batch, full
