"""Token templates and training batches for the squares task.

A *template* is one conversation shape rendered exactly as inference renders it: contract
messages -> `lower_messages` -> the engine's `render_prompt` -> mlx-vlm's `prepare_inputs`
(which expands each image placeholder to the model's image tokens). Rows of a batch share the
template and differ only in the image pixels and the answer, so each template is rendered once.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

import mlx.core as mx
import numpy as np
from mlx_vlm.utils import prepare_inputs as _prepare_inputs
from mlx_vlm.utils import should_add_special_tokens
from PIL import Image

from training.squares import IMAGE_SIZE, NO_IMAGE_ANSWER, PALETTE, SquaresSample, answer_for, encode_png
from training.squares_conversations import (
    Conversation,
    agent_first_turn,
    agent_follow_up,
    agent_tool_result,
    image_shapes,
    png_image_part,
    strip_images,
)
from training.squares_forward import Batch, vision_rotary
from vlmserve.engine.prep.lowering import lower_messages
from vlmserve.engine.prep.prompt import render_prompt
from vlmserve.engine.v1 import engine_pb2 as pb

prepare_inputs: Any = _prepare_inputs  # untyped in mlx-vlm

IM_END = "<|im_end|>"
PLACEHOLDER_ANSWER = "0 none"
# Earlier answers in replayed follow-ups; several, so none of them predicts the image.
FOLLOW_UP_PREVIOUS_ANSWERS = ("3 red", "6 green", "2 purple", "no image")
ALL_ANSWERS = tuple(answer_for(n, colour) for n in range(2, 8) for colour in sorted(PALETTE))


@dataclass(frozen=True)
class Template:
    """A rendered conversation shape. `target_ids` is None when the answer depends on the image."""

    shape: str
    prompt_ids: np.ndarray  # (L,) the prompt as the engine tokenises it
    n_images: int
    target_ids: tuple[int, ...] | None
    positions: np.ndarray  # (3, L + max answer length) M-RoPE positions of prompt + answer
    # First token of the suffix: the first image token, else the prompt's last token.
    split: int


def _placeholder_png() -> bytes:
    return encode_png(Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (255, 255, 255)))


def render_text(conversation: Conversation, tokenizer: Any) -> str:
    """The prompt text inference builds for a conversation (lowered, then rendered)."""
    return render_prompt(
        lower_messages(conversation.messages), template=tokenizer, tools=conversation.tools
    ).text


def reply_text(conversation: Conversation, tokenizer: Any) -> str:
    """What the model must write, taken from the template's own rendering of the reply turn."""
    reply = pb.Message(role=pb.ROLE_ASSISTANT)
    if conversation.tool_call is not None:
        reply.tool_calls.append(conversation.tool_call)
    else:
        reply.parts.append(pb.Part(text=pb.TextPart(text=conversation.answer or "")))
    lowered = lower_messages(conversation.messages)
    prompt = render_prompt(lowered, template=tokenizer, tools=conversation.tools).text
    follow_up = pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text="next"))])
    history = render_prompt([*lowered, reply, follow_up], template=tokenizer, tools=conversation.tools).text
    if not history.startswith(prompt):
        raise AssertionError(f"{conversation.shape}: the reply turn does not extend the prompt")
    return history[len(prompt) :].split(IM_END, 1)[0]


class Tokens:
    """Tokenises prompts and replies the way mlx-vlm generation does."""

    def __init__(self, model: Any, processor: Any) -> None:
        self.model = model
        self.processor = processor
        self.tokenizer = processor.tokenizer
        self.image_token_id = int(model.config.image_token_id)
        self.pad_id = int(self.tokenizer.pad_token_id)
        self.im_end_id = int(self.tokenizer.convert_tokens_to_ids(IM_END))
        self._add_special = should_add_special_tokens(model.config.model_type, processor)
        self._placeholder = Image.new("RGB", (IMAGE_SIZE, IMAGE_SIZE), (255, 255, 255))
        self.answer_ids = {text: self.reply_ids(text) for text in (*ALL_ANSWERS, NO_IMAGE_ANSWER)}
        self.max_answer_len = max(len(ids) for ids in self.answer_ids.values())
        self._rotary: dict[tuple[int, ...], mx.array] = {}

    def vision_rotary(self, grid: mx.array) -> mx.array:
        """The vision tower's rotary table for this many same-size images (cached)."""
        key = tuple(np.array(grid).reshape(-1).tolist())
        if key not in self._rotary:
            self._rotary[key] = vision_rotary(self.model, grid)
        return self._rotary[key]

    def prompt_ids(self, text: str, n_images: int) -> np.ndarray:
        images = [self._placeholder] * n_images or None
        inputs = prepare_inputs(
            self.processor, images=images, prompts=[text], add_special_tokens=self._add_special
        )
        return np.array(inputs["input_ids"][0], dtype=np.int32)

    def reply_ids(self, text: str) -> tuple[int, ...]:
        return (*self.tokenizer.encode(text, add_special_tokens=False), self.im_end_id)

    def positions(self, ids: np.ndarray, n_images: int) -> np.ndarray:
        """M-RoPE positions (3, len) computed by the model's own code (every image 112x112)."""
        grid = mx.array([[1, 8, 8]] * n_images) if n_images else None
        model_lm = self.model.language_model
        positions, _ = model_lm.get_rope_index(mx.array(ids[None, :]), grid, None, None)
        positions = np.array(positions)
        if positions.ndim == 2:  # text only: one sequence shared by the three sections
            positions = np.broadcast_to(positions[None], (3, *positions.shape))
        return np.asarray(positions[:, 0, :])

    def template(self, conversation: Conversation) -> Template:
        text = render_text(conversation, self.tokenizer)
        n_images = sum(1 for _ in text.split("<|image_pad|>")) - 1
        prompt_ids = self.prompt_ids(text, n_images)
        reply = reply_text(conversation, self.tokenizer)
        depends_on_image = n_images > 0 and conversation.tool_call is None
        target_ids = None if depends_on_image else self.reply_ids(reply)
        if depends_on_image and reply != PLACEHOLDER_ANSWER:
            raise AssertionError(f"{conversation.shape}: reply {reply!r} is not the answer as written")
        tail = self.max_answer_len if target_ids is None else len(target_ids)
        padded = np.concatenate([prompt_ids, np.full(tail, self.pad_id, dtype=np.int32)])
        image_at = np.nonzero(prompt_ids == self.image_token_id)[0]
        split = int(image_at[0]) if len(image_at) else len(prompt_ids) - 1
        return Template(
            shape=conversation.shape,
            prompt_ids=prompt_ids,
            n_images=n_images,
            target_ids=target_ids,
            positions=self.positions(padded, n_images),
            split=split,
        )


def build_templates(tokens: Tokens) -> tuple[list[Template], list[Template]]:
    """(image templates, text-only templates): every shape, its detail/tool variants and controls.

    Controls come two ways: the image removed from the request before lowering (what a client or
    a translating proxy that drops it sends), and images stripped after lowering (an engine that
    drops them). Identical token sequences are kept once.
    """
    image = png_image_part(_placeholder_png())
    high = png_image_part(_placeholder_png(), detail=pb.IMAGE_DETAIL_HIGH)
    with_image = [
        replace(build(image, PLACEHOLDER_ANSWER), shape=name) for name, build in image_shapes().items()
    ]
    with_image.append(agent_tool_result(high, PLACEHOLDER_ANSWER, shape="agent_tool_detail_high"))
    for variant in (1, 2):
        with_image.append(agent_tool_result(image, PLACEHOLDER_ANSWER, tool_variant=variant))
        with_image.append(agent_tool_result(image, PLACEHOLDER_ANSWER, with_text=False, tool_variant=variant))
    for previous in FOLLOW_UP_PREVIOUS_ANSWERS[1:]:
        with_image.append(agent_follow_up(image, PLACEHOLDER_ANSWER, previous_answer=previous))
    text_only: list[Conversation] = [agent_first_turn(variant) for variant in range(3)]
    for name, build in image_shapes().items():
        removed = build(None, PLACEHOLDER_ANSWER)
        text_only.append(Conversation(f"control_{name}", removed.messages, removed.tools, NO_IMAGE_ANSWER))
    for conversation in with_image:
        dropped = strip_images(lower_messages(conversation.messages))
        text_only.append(
            Conversation(
                f"control_dropped_{conversation.shape}", dropped, conversation.tools, NO_IMAGE_ANSWER
            )
        )
    return _unique([tokens.template(c) for c in with_image]), _unique([tokens.template(c) for c in text_only])


def _unique(templates: Sequence[Template]) -> list[Template]:
    seen: set[tuple[bytes, tuple[int, ...] | None]] = set()
    kept: list[Template] = []
    for template in templates:
        key = (template.prompt_ids.tobytes(), template.target_ids)
        if key not in seen:
            seen.add(key)
            kept.append(template)
    return kept


def image_batch(
    template: Template, samples: Sequence[SquaresSample], tokens: Tokens
) -> tuple[Batch, np.ndarray]:
    """Rows of `template` with these samples' images and answers; also the full rows (for checks)."""
    rows = len(samples)
    answers = [tokens.answer_ids[s.answer] for s in samples]
    return _batch(template, answers, tokens, [s.image for s in samples], rows)


def text_batch(template: Template, tokens: Tokens) -> tuple[Batch, np.ndarray]:
    """The single row of a text-only template (every row would be the same)."""
    assert template.target_ids is not None
    return _batch(template, [template.target_ids], tokens, [], 1)


def _batch(
    template: Template,
    answers: Sequence[Sequence[int]],
    tokens: Tokens,
    images: Sequence[Image.Image],
    rows: int,
) -> tuple[Batch, np.ndarray]:
    # Fixed sizes per template (prompt + the longest reply; every row's reply slots), so that a
    # compiled training step is traced once per template and reused.
    prompt_len = len(template.prompt_ids)
    width = template.positions.shape[1]
    reply_slots = width - prompt_len
    full = np.full((rows, width), tokens.pad_id, dtype=np.int32)
    split = template.split
    suffix_len = width - split
    loss_index = np.zeros(rows * reply_slots, dtype=np.int32)
    loss_row = np.zeros(rows * reply_slots, dtype=np.int32)
    targets = np.zeros(rows * reply_slots, dtype=np.int32)
    weights = np.zeros(rows * reply_slots, dtype=np.float32)
    for row, answer in enumerate(answers):
        if len(answer) > reply_slots:
            raise ValueError(f"{template.shape}: a reply of {len(answer)} tokens does not fit")
        full[row, :prompt_len] = template.prompt_ids
        full[row, prompt_len : prompt_len + len(answer)] = answer
        for k, token in enumerate(answer):
            slot = row * reply_slots + k
            # the logit at position t predicts token t+1
            loss_index[slot] = row * suffix_len + (prompt_len - 1 + k - split)
            loss_row[slot] = row
            targets[slot] = token
            weights[slot] = 1.0
    suffix = full[:, split:]
    positions = template.positions
    pixel_values = grid = embed_index = rotary = None
    if images:
        if len(images) != rows * template.n_images:
            raise ValueError(f"{template.shape}: {template.n_images} images per row, in row order")
        processed = tokens.processor.image_processor(images=list(images))
        pixel_values = mx.array(np.asarray(processed["pixel_values"]))
        grid = mx.array(np.asarray(processed["image_grid_thw"]))
        rotary = tokens.vision_rotary(grid)
        is_image = suffix.reshape(-1) == tokens.image_token_id
        index = np.arange(suffix.size)
        index[is_image] = suffix.size + np.arange(int(is_image.sum()))
        embed_index = mx.array(index)
    batch = Batch(
        prefix_ids=mx.array(template.prompt_ids[None, :split]),
        prefix_positions=mx.array(positions[:, None, :split]),
        suffix_ids=mx.array(suffix),
        suffix_positions=mx.array(np.broadcast_to(positions[:, None, split:], (3, rows, suffix_len))),
        pixel_values=pixel_values,
        image_grid_thw=grid,
        vision_rotary=rotary,
        embed_index=embed_index,
        loss_index=mx.array(loss_index),
        targets=mx.array(targets),
        loss_row=mx.array(loss_row),
        loss_weight=mx.array(weights),
    )
    return batch, full


def draw_samples(rng: random.Random, n: int) -> list[SquaresSample]:
    from training.squares import draw_sample

    return [draw_sample(rng) for _ in range(n)]
