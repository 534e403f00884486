"""A training forward pass for mlx-vlm's qwen2_vl and qwen3_vl that shares the prompt prefix
across a batch.

Every row of a training batch is the same rendered conversation up to its first image token
(system prompt, tools block, earlier turns); only the image and the answer differ. The prefix
therefore runs once (batch 1) and its keys/values are broadcast to the batch, which makes the
long tool-loop prompts as cheap to train as the short ones. Logits are computed only where the
loss needs them. `check_against_model` proves the result equals mlx-vlm's own forward.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np


@dataclass(frozen=True)
class Batch:
    """One template's rows. Shapes: P prefix tokens, B rows, S suffix tokens, K loss positions."""

    prefix_ids: mx.array  # (1, P)
    prefix_positions: mx.array  # (3, 1, P) M-RoPE positions
    suffix_ids: mx.array  # (B, S): image tokens, prompt tail, answer, right padding
    suffix_positions: mx.array  # (3, B, S)
    pixel_values: mx.array | None  # (B * patches, C*T*p*p) or None for text-only rows
    image_grid_thw: mx.array | None  # (B, 3)
    vision_rotary: mx.array | None  # (B * patches, head_dim / 2), see `vision_rotary`
    # Flat (B*S) -> row in concat(token embeddings, image features): puts images in place.
    embed_index: mx.array | None  # (B*S,)
    loss_index: mx.array  # (K,) flat positions in (B*S) whose next token is a target
    targets: mx.array  # (K,)
    loss_row: mx.array  # (K,) which row each loss position belongs to
    # (K,) 1 for a real target, 0 for padding: K is fixed per template so compiled steps are reused
    loss_weight: mx.array

    def arrays(self) -> dict[str, mx.array]:
        """The batch as a flat dict of arrays (what `mx.compile` takes)."""
        return {name: value for name, value in vars(self).items() if value is not None}

    @classmethod
    def from_arrays(cls, arrays: dict[str, mx.array]) -> Batch:
        names = cls.__dataclass_fields__
        return cls(**{name: arrays.get(name) for name in names})  # type: ignore[arg-type]


class PrefixCache:
    """Holds the prefix's keys/values (batch 1) and serves them broadcast to the suffix batch.

    Duck-types the parts of mlx-vlm's KVCache that qwen2_vl's attention touches.
    """

    def __init__(self) -> None:
        self.keys: mx.array | None = None
        self.values: mx.array | None = None
        self.offset = 0

    def update_and_fetch(self, keys: mx.array, values: mx.array) -> tuple[mx.array, mx.array]:
        if self.keys is None or self.values is None:
            self.keys, self.values = keys, values
            self.offset = keys.shape[2]
            return keys, values
        batch = keys.shape[0]
        prefix_keys = mx.broadcast_to(self.keys, (batch, *self.keys.shape[1:]))
        prefix_values = mx.broadcast_to(self.values, (batch, *self.values.shape[1:]))
        return mx.concatenate([prefix_keys, keys], axis=2), mx.concatenate([prefix_values, values], axis=2)


def suffix_mask(prefix_len: int, suffix_len: int) -> mx.array:
    """Suffix rows see the whole prefix and, causally, the suffix."""
    causal = np.tril(np.ones((suffix_len, suffix_len), dtype=bool))
    return mx.array(np.concatenate([np.ones((suffix_len, prefix_len), dtype=bool), causal], axis=1))


def vision_rotary(model: Any, image_grid_thw: mx.array) -> mx.array:
    """The vision tower's rotary frequencies for these grids (computed eagerly, once per batch)."""
    frequencies: mx.array = model.vision_tower.rot_pos_emb(image_grid_thw)
    return frequencies


def _per_image_heads(x: mx.array, n_images: int, heads: int) -> mx.array:
    """(1, tokens, heads, d) -> (images, heads, tokens per image, d)."""
    return x.reshape(n_images, x.shape[1] // n_images, heads, -1).transpose(0, 2, 1, 3)


def vision_features(model: Any, pixel_values: mx.array, rotary: mx.array, n_images: int) -> mx.array:
    """mlx-vlm's qwen2_vl vision tower for same-size images, attention batched per image.

    The same computation as `VisionModel.__call__` (checked end to end by `check_against_model`),
    with one attention call for all images instead of a loop over them.
    """
    from mlx_vlm.models.qwen2_vl.vision import apply_rotary_pos_emb_vision

    tower = model.vision_tower
    hidden = tower.patch_embed(pixel_values.astype(tower.patch_embed.proj.weight.dtype))
    tokens = hidden.shape[0]
    for block in tower.blocks:
        attention = block.attn
        heads = attention.num_heads
        qkv = attention.qkv(block.norm1(hidden)).reshape(tokens, 3, heads, -1).transpose(1, 0, 2, 3)
        queries, keys, values = mx.split(qkv, 3)
        queries = apply_rotary_pos_emb_vision(mx.expand_dims(queries, 0), rotary)[0]
        keys = apply_rotary_pos_emb_vision(mx.expand_dims(keys, 0), rotary)[0]
        queries, keys, values = (_per_image_heads(x, n_images, heads) for x in (queries, keys, values))
        attended = mx.fast.scaled_dot_product_attention(queries, keys, values, scale=attention.scale)
        attended = attended.transpose(0, 2, 1, 3).reshape(tokens, -1)
        hidden = hidden + attention.proj(attended)
        hidden = hidden + block.mlp(block.norm2(hidden))
    features: mx.array = tower.merger(hidden)
    return features


def image_features(model: Any, batch: Batch) -> tuple[mx.array, list[mx.array] | None]:
    """The batch's image features (in row order) and, for Qwen3-VL, its deepstack features
    (what the tower's chosen blocks add to the first text layers' image tokens)."""
    assert batch.pixel_values is not None and batch.image_grid_thw is not None
    if model.config.model_type == "qwen3_vl":  # mlx-vlm's own tower (its attention is per image)
        tower = model.vision_tower
        dtype = tower.patch_embed.proj.weight.dtype
        features, deepstack = tower(batch.pixel_values.astype(dtype), batch.image_grid_thw)
        return features, list(deepstack)
    assert batch.vision_rotary is not None
    images = int(batch.image_grid_thw.shape[0])  # same-size images, one or more per row
    return vision_features(model, batch.pixel_values, batch.vision_rotary, images), None


def answer_logits(model: Any, batch: Batch) -> mx.array:
    """Logits (K, vocab) at the batch's loss positions."""
    text_model = model.language_model.model
    caches = [PrefixCache() for _ in text_model.layers]
    prefix_len = batch.prefix_ids.shape[1]
    prefix_embeds = text_model.embed_tokens(batch.prefix_ids)
    text_model(
        batch.prefix_ids,
        inputs_embeds=prefix_embeds,
        mask="causal" if prefix_len > 1 else None,
        cache=caches,
        position_ids=batch.prefix_positions,
    )
    rows, suffix_len = batch.suffix_ids.shape
    embeds = text_model.embed_tokens(batch.suffix_ids)
    deepstack: dict[str, Any] = {}
    if batch.pixel_values is not None and batch.embed_index is not None:
        features, deepstack_features = image_features(model, batch)
        width = embeds.shape[-1]
        table = mx.concatenate([embeds.reshape(-1, width), features.astype(embeds.dtype)], axis=0)
        embeds = table[batch.embed_index].reshape(rows, suffix_len, width)
        if deepstack_features is not None:
            image_token = int(model.config.image_token_id)
            deepstack = {
                "visual_pos_masks": batch.suffix_ids == image_token,
                "deepstack_visual_embeds": [f.astype(embeds.dtype) for f in deepstack_features],
            }
    hidden = text_model(
        batch.suffix_ids,
        inputs_embeds=embeds,
        mask=suffix_mask(prefix_len, suffix_len),
        cache=caches,
        position_ids=batch.suffix_positions,
        **deepstack,
    )
    selected = hidden.reshape(rows * suffix_len, -1)[batch.loss_index]
    language_model = model.language_model
    logits: mx.array = (
        text_model.embed_tokens.as_linear(selected)
        if language_model.args.tie_word_embeddings
        else language_model.lm_head(selected)
    )
    return logits


def loss_fn(model: Any, batch: Batch) -> mx.array:
    """Mean cross-entropy over the answer tokens (the `<|im_end|>` included)."""
    logits = answer_logits(model, batch)
    losses = nn.losses.cross_entropy(logits.astype(mx.float32), batch.targets, reduction="none")
    loss: mx.array = (losses * batch.loss_weight).sum() / batch.loss_weight.sum()
    return loss


def row_exact_match(model: Any, batch: Batch) -> np.ndarray:
    """Per row: every answer token is the argmax given the right prefix.

    Equal to "greedy decoding reproduces the answer and stops", without generating.
    """
    predicted = mx.argmax(answer_logits(model, batch), axis=-1)
    correct = np.array(predicted == batch.targets) | (np.array(batch.loss_weight) == 0)
    rows = np.array(batch.loss_row)
    n_rows = int(batch.suffix_ids.shape[0])
    ok = np.ones(n_rows, dtype=bool)
    np.logical_and.at(ok, rows, correct)
    return ok


def check_against_model(model: Any, batch: Batch, full_ids: np.ndarray, atol: float = 1e-3) -> float:
    """Max |difference| between our logits and mlx-vlm's own forward on the unsplit rows.

    `full_ids` (B, P+S) are the rows as the engine would tokenise them. Raises if they differ.
    """
    ours = np.array(answer_logits(model, batch).astype(mx.float32))
    rows, suffix_len = batch.suffix_ids.shape
    prefix_len = batch.prefix_ids.shape[1]
    loss_index = np.array(batch.loss_index)
    loss_row = np.array(batch.loss_row)
    real = np.array(batch.loss_weight) > 0
    worst = 0.0
    patches_per_row = images_per_row = 0
    if batch.pixel_values is not None and batch.image_grid_thw is not None:
        patches_per_row = batch.pixel_values.shape[0] // rows
        images_per_row = batch.image_grid_thw.shape[0] // rows
    for row in range(rows):
        kwargs: dict[str, Any] = {}
        if batch.pixel_values is not None and batch.image_grid_thw is not None:
            kwargs["pixel_values"] = batch.pixel_values[row * patches_per_row : (row + 1) * patches_per_row]
            kwargs["image_grid_thw"] = batch.image_grid_thw[row * images_per_row : (row + 1) * images_per_row]
        model.language_model._position_ids = None  # mlx-vlm caches prefill positions between calls
        model.language_model._rope_deltas = None
        reference = model(mx.array(full_ids[row : row + 1]), **kwargs).logits[0]
        selected = real & (loss_row == row)
        positions = prefix_len + loss_index[selected] % suffix_len
        reference_logits = np.array(reference[mx.array(positions)].astype(mx.float32))
        worst = max(worst, float(np.abs(reference_logits - ours[selected]).max()))
    if worst > atol:
        raise AssertionError(f"training forward differs from mlx-vlm's by {worst}")
    return worst
