"""One DFlash drafter forward for every row that drafts this step (issue 37.1), where mlx-vlm's
drafter runs one forward per row.

mlx-vlm's `DFlashDraftModel._hidden` takes one row: its attention ropes with the cache's scalar
offset and attends without a mask (the block is non-causal), so rows whose contexts differ in
length cannot share it, and its own batched loop keeps one cache per row for that reason ("the
DFlash drafter cache is scalar-offset and has proven unsafe as a single batched cache"). Here the
rows keep their own caches (mlx-vlm's `KVCache`, updated as its attention updates them) and one
forward runs them together: the token and context projections, norms, MLPs and output projection
over the batch at once, with mlx-vlm's modules and weights; per row only what its offset decides
(the rotary positions, the cache update); each row's keys (its cache, then its block) left-padded
to the longest, with a mask that also hides the block positions past the row's own block size,
so each row's queries see exactly the keys its own forward would: the same drafts, one forward.

Only mlx-vlm's plain DFlash layer is batched (full attention, non-causal, unbounded `KVCache`):
`supports_batched` says so; the others (sliding windows, `draft_window_size` rotating caches,
DFlash2's convolutions) keep a forward per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

__all__ = ["batched_hidden", "supports_batched"]


def supports_batched(model: Any) -> bool:
    """Whether `batched_hidden` computes what `model._hidden` computes, row by row."""
    from mlx_vlm.models.cache import KVCache
    from mlx_vlm.speculative.drafters.qwen3_dflash.dflash import (
        DFlashAttention,
        DFlashDecoderLayer,
        DFlashDraftModel,
    )

    if type(model) is not DFlashDraftModel or getattr(model.config, "draft_window_size", None):
        return False
    caches = model.make_cache()
    return all(
        type(layer) is DFlashDecoderLayer
        and type(layer.self_attn) is DFlashAttention
        and not layer.self_attn.is_sliding
        and not layer.self_attn.is_causal
        and type(cache) is KVCache
        for layer, cache in zip(model.layers, caches, strict=True)
    )


def batched_hidden(
    model: Any,
    tokens: Sequence[int],
    sizes: Sequence[int],
    contexts: Sequence[Any],
    caches: Sequence[Sequence[Any]],
) -> Any:
    """The drafter's last hidden states [rows, max(sizes), hidden] for blocks [tokens[i], mask x
    (sizes[i] - 1)] over each row's new context `contexts[i]` ([1, n_i, layers x hidden]) and
    cache `caches[i]` (one per drafter layer; each row's new context keys are appended to it).
    Row i's first sizes[i] positions are what `model._hidden` gives for it alone."""
    import mlx.core as mx

    width = max(sizes)
    mask_id = int(model.config.mask_token_id)
    block = mx.array([[token] + [mask_id] * (width - 1) for token in tokens], dtype=mx.int32)
    lengths = [int(context.shape[1]) for context in contexts]
    longest = max(lengths)
    context = mx.concatenate(
        [
            mx.pad(c, [(0, 0), (0, longest - n), (0, 0)]) if n < longest else c
            for c, n in zip(contexts, lengths, strict=True)
        ],
        axis=0,
    )
    h = model._embed_input_tokens(block)
    h_ctx = model.hidden_norm(model.fc(context))
    projected = model._project_context_kv(h_ctx)
    # The block positions a row's keys include: its own block size (a shorter block's masks are
    # not there in its own forward, and the block attends both ways).
    in_block = mx.array([[j < size for j in range(width)] for size in sizes])
    for index, (layer, *row_caches) in enumerate(zip(model.layers, *caches, strict=True)):
        context_kv = None if projected is None else projected[index]
        x = layer.input_layernorm(h)
        h = h + _attention(layer.self_attn, model.rope, x, h_ctx, context_kv, row_caches, lengths, in_block)
        h = h + layer.mlp(layer.post_attention_layernorm(h))
    return model.norm(h)


def _attention(
    attention: Any,
    rope: Any,
    x: Any,
    x_ctx: Any,
    context_kv: tuple[Any, Any] | None,
    caches: Sequence[Any],
    lengths: Sequence[int],
    in_block: Any,
) -> Any:
    """mlx-vlm's `DFlashAttention.__call__` for every row at once (its steps in its order)."""
    import mlx.core as mx

    rows, width, _ = x.shape
    longest = x_ctx.shape[1]
    heads, kv_heads = attention.n_heads, attention.n_kv_heads
    queries = attention.q_proj(x)
    ctx_keys, ctx_values = attention._project_kv(x_ctx) if context_kv is None else context_kv
    prop_keys, prop_values = attention._project_kv(x)
    queries = attention.q_norm(queries.reshape(rows, width, heads, -1)).transpose(0, 2, 1, 3)
    ctx_keys = attention.k_norm(ctx_keys.reshape(rows, longest, kv_heads, -1)).transpose(0, 2, 1, 3)
    ctx_values = ctx_values.reshape(rows, longest, kv_heads, -1).transpose(0, 2, 1, 3)
    prop_keys = attention.k_norm(prop_keys.reshape(rows, width, kv_heads, -1)).transpose(0, 2, 1, 3)
    prop_values = prop_values.reshape(rows, width, kv_heads, -1).transpose(0, 2, 1, 3)
    roped: list[Any] = []
    row_keys: list[Any] = []
    row_values: list[Any] = []
    for i, (cache, n) in enumerate(zip(caches, lengths, strict=True)):
        offset = int(cache.offset)
        roped.append(rope(queries[i : i + 1], offset=offset + n))
        keys, values = cache.update_and_fetch(
            rope(ctx_keys[i : i + 1, :, :n], offset=offset), ctx_values[i : i + 1, :, :n]
        )
        row_keys.append(mx.concatenate([keys, rope(prop_keys[i : i + 1], offset=offset + n)], axis=2))
        row_values.append(mx.concatenate([values, prop_values[i : i + 1]], axis=2))
    total = max(int(keys.shape[2]) for keys in row_keys)
    masks = []
    for i, keys in enumerate(row_keys):
        pad = total - int(keys.shape[2])
        if pad:
            row_keys[i] = mx.pad(keys, [(0, 0), (0, 0), (pad, 0), (0, 0)])
            row_values[i] = mx.pad(row_values[i], [(0, 0), (0, 0), (pad, 0), (0, 0)])
        context = mx.concatenate(
            [mx.zeros((pad,), dtype=mx.bool_), mx.ones((total - pad - width,), dtype=mx.bool_)]
        )
        masks.append(mx.concatenate([context, in_block[i]]))
    mask = mx.stack(masks)[:, None, None, :]  # [rows, 1, 1, keys]: every query alike
    output = mx.fast.scaled_dot_product_attention(
        mx.concatenate(roped, axis=0),
        mx.concatenate(row_keys, axis=0),
        mx.concatenate(row_values, axis=0),
        scale=attention.scale,
        mask=mask,
        sinks=attention.attention_sink_bias,
    )
    return attention.o_proj(output.transpose(0, 2, 1, 3).reshape(rows, width, -1))
