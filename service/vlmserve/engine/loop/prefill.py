"""Prompt forwards, the one place a prompt runs through the model (generation thread only).

Two ways, both written here: one row's next chunk on its own cache (`prefill_chunk`; its KV
cache and first token are then exactly what it gets alone), and several rows' whole rests in one
forward (`prefill_group`), straight into a batch cache. The prompt batch runs them
(prompt_batch.py), the scheduler decides how much (scheduler.py), the decode batch takes the KV
(batch.py).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from vlmserve.engine.kv.merge import merge_rows
from vlmserve.engine.loop.model_inputs import ModelInputs
from vlmserve.engine.speculation.rollback import verify_forward_kwargs

__all__ = ["HiddenReader", "PrefilledGroup", "groupable", "prefill_chunk", "prefill_group", "prompt_rest"]


class HiddenReader(Protocol):
    """What a drafter model reads of the target's forwards (speculation/drafter.py `Speculator`):
    the hidden states of these layers besides the last, and its input from them."""

    @property
    def capture_layer_ids(self) -> tuple[int, ...]: ...

    def target_hidden(self, hidden_states: Any) -> Any: ...

    def keeps_prompt_hidden(self) -> bool:
        """Whether a prompt admitted now keeps its hidden states: its drafter would start over
        them at the row's first decode step."""
        ...


# Prefill arguments a shared, left-padded prefill forward knows how to carry (the grids only
# matter to a forward that computes positions itself; this one is given them).
_GROUPABLE_PREFILL_KWARGS = frozenset({"position_ids", "rope_deltas", "image_grid_thw", "video_grid_thw"})


def prefill_chunk(
    language_model: Any,
    inputs: ModelInputs,
    cache: list[Any],
    start: int,
    end: int,
    *,
    hidden: tuple[HiddenReader, list[Any]] | None = None,
) -> Any:
    """Prompt positions [start, end) of one row on its own cache; the forward's logits
    [1, end - start, vocab] (lazy). With `hidden` (a reader, a list), what the reader reads of
    the chunk's hidden states ([1, n, ...]) is appended to the list (a drafter model starts from
    them: speculation/model_drafter.py, dflash_drafter.py)."""
    extra = verify_forward_kwargs(language_model, hidden[0].capture_layer_ids) if hidden is not None else {}
    kwargs = inputs.prefill_kwargs
    positions = kwargs.get("position_ids")
    if positions is not None and positions.shape[-1] == inputs.input_ids.shape[1]:
        # The chunk's own positions: Qwen's models cut the whole prompt's to the chunk
        # themselves, GLM-4V's take what they are given.
        kwargs = {**kwargs, "position_ids": positions[..., start:end]}
    output = language_model(
        inputs.input_ids[:, start:end],
        inputs_embeds=inputs.embeds[:, start:end],
        cache=cache,
        **kwargs,
        **extra,
    )
    if extra and hidden is not None:
        hidden[1].append(hidden[0].target_hidden(output.hidden_states))
    return output.logits


def groupable(inputs: ModelInputs) -> bool:
    """Whether a prompt can share a left-padded forward: it carries its positions explicitly
    (Qwen-style M-RoPE position ids), so padding cannot shift them, and nothing else the shared
    forward could not carry."""
    positions = inputs.prefill_kwargs.get("position_ids")
    return (
        positions is not None
        and positions.ndim in (2, 3)
        and inputs.rope_deltas is not None  # M-RoPE (Qwen-VL family): positions are all explicit
        and set(inputs.prefill_kwargs) <= _GROUPABLE_PREFILL_KWARGS
    )


def prompt_rest(inputs: ModelInputs, start: int) -> tuple[Any, Any, Any]:
    """The prompt from `start` on: (input ids [1, n], embeddings [1, n, hidden], position ids
    [3, 1, n])."""
    import mlx.core as mx

    positions = inputs.prefill_kwargs["position_ids"]
    if positions.ndim == 2:  # text only: the same position on all three M-RoPE axes
        positions = mx.broadcast_to(positions[None], (3, *positions.shape))
    return inputs.input_ids[:, start:], inputs.embeds[:, start:], positions[..., start:]


@dataclass(frozen=True, slots=True)
class PrefilledGroup:
    # One batch cache per layer, a row per prompt (its padding on the left).
    caches: list[Any]
    # Each row's last prompt token's logits [rows, vocab] (lazy).
    last_logits: Any
    # The rows' M-RoPE deltas [rows, 1]; None for plain RoPE.
    rope_deltas: Any


def prefill_group(
    language_model: Any,
    rests: Sequence[tuple[Any, Any, Any]],
    own_caches: Sequence[list[Any]],
    rope_deltas: Sequence[Any],
) -> PrefilledGroup:
    """Several prompts' rests (`prompt_rest`) in one forward, each after its own cache (empty,
    or a prefix from the prefix cache or another request in flight).

    On a CPU a forward costs about the same for one short prompt as for several (reading the
    weights dominates), so requests that arrive together start together. mlx-vlm's `merge`
    left-pads the rows' caches to one length. The rests are right-padded to the longest one, so
    every row's real tokens sit right after its prefix (and never see the padding: the mask is
    causal), and `finalize()` then rolls each row's padding to the left, where the batch cache
    expects it. Positions are each row's own (explicit M-RoPE position ids).
    """
    import mlx.core as mx

    lengths = [ids.shape[1] for ids, _, _ in rests]
    longest = max(lengths)
    ids, embeds, positions = [], [], []
    for (row_ids, row_embeds, row_positions), length in zip(rests, lengths, strict=True):
        pad = longest - length
        ids.append(mx.pad(row_ids, [(0, 0), (0, pad)]))
        embeds.append(mx.pad(row_embeds, [(0, 0), (0, pad), (0, 0)]))
        positions.append(mx.pad(row_positions, [(0, 0), (0, 0), (0, pad)]))
    caches = [merge_rows(rows) for rows in zip(*own_caches, strict=True)]
    for layer in caches:
        layer.prepare(right_padding=[longest - n for n in lengths])
    output = language_model(
        mx.concatenate(ids, axis=0),
        inputs_embeds=mx.concatenate(embeds, axis=0),
        cache=caches,
        position_ids=mx.concatenate(positions, axis=1),
    )
    for layer in caches:
        layer.finalize()
    last = output.logits[mx.arange(len(rests)), mx.array(lengths) - 1]
    deltas = (
        mx.concatenate([d.reshape(1, -1) for d in rope_deltas], axis=0)
        if rope_deltas[0] is not None
        else None
    )
    return PrefilledGroup(caches, last, deltas)
