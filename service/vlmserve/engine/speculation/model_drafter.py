"""mlx-vlm's drafter models (`--draft-model`), batched: one drafter state for all drafting rows.

`load_drafter` (mlx-vlm's `speculative.drafters`) loads the checkpoint and auto-detects its kind
from its config as mlx-vlm's server does (`model_type`, an `mtp` name, `num_nextn_predict_layers`);
`validate_drafter_compatibility` checks it against the target. The drafting itself is mlx-vlm's
code, on one batched drafter state (its `BatchKVCache`, per-row positions and seeds, as its
`_mtp_rounds_batch` keeps them): `draft_block` proposes every drafting row's drafts in one
forward per draft position, `accept_verified_tokens_batch` feeds all rows the target's hidden
states for the tokens each kept (ragged: each row its own count), `filter_batch` drops rows.

Wrapped where mlx-vlm's batched rounds fall short of our rows (docs/performance.md):
- its rows are fixed when a round loop starts (`filter_batch` drops rows, nothing adds one); ours
  join at any step. A joining row's drafter starts alone, on its own copy of the module (a
  shallow copy: the weights are shared): from the prompt's hidden states when the row ran its
  prompt itself (mlx-vlm's `prefill_from_target_hidden`; the last `PROMPT_HIDDEN_POSITIONS`
  positions, after any cached prefix), else (a prompt run in a shared forward) from its first
  token's; after its first verify its state joins the batch (its KV cache merged and extended
  into the batch's, its position and seed concatenated);
- every row of its round drafts with the drafter, the same block; ours draft from the grammar,
  prompt lookup or the drafter, per row and per step, each its own count. So the drafter drafts
  the longest count any row asks for, for every row it holds (one forward per position whatever
  the rows), each asking row takes its own first ones; when a row it holds took other drafts
  that step, the positions the round appended are trimmed for every row (uniform) before the
  batched accept, so each row's accepted drafts, whatever proposed them, and its next token are
  replayed with the target's hidden states (mlx-vlm keeps the drafter's own positions for
  accepted drafts, which holds only when the drafter proposed them);
- a drafter whose batched accept needs every row to accept the same count
  (`requires_uniform_batch_acceptance`: the MTP heads on mlx-vlm's `mtp_base`) keeps one state
  per row, each drafting in its own `draft_block`, evaluated together.

Drafts are the drafter's argmax, so the acceptance rule's draft distribution is one-hot for every
row, greedy or sampled (acceptance.py).

Kinds: `mtp` heads here (batched where mlx-vlm accepts ragged batches: Qwen3.5's,
`supports_ragged_batch_acceptance`), and `eagle3` drafters, which speak the same protocol
(`prefill_from_target_hidden`, `draft_block`, `accept_verified_tokens`) on the hidden states of
three chosen target layers (their config's `capture_layer_ids`, asked of every forward with
mlx-vlm's `capture_layer_ids`, side by side), batched as the ragged MTP heads are (their batched
accept takes ragged counts: `requires_uniform_batch_acceptance` False). `dflash` drafters on
mlx-vlm's `DFlashDraftModel` (DFlash, DFlash2, DSpark) are dflash_drafter.py's; the DFlash kinds
with context state of their own are refused at load with why (docs/models.md).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeAlias

from vlmserve.engine.speculation.drafter_row import DrafterRow, DraftModelError

if TYPE_CHECKING:
    from vlmserve.engine.speculation.dflash_drafter import DFlashDrafter

__all__ = ["AnyDrafter", "DraftModelError", "ModelDrafter", "load_model_drafter"]

log = logging.getLogger(__name__)

SUPPORTED_KINDS = ("mtp", "dflash", "eagle3")


@dataclass
class _DraftBatch:
    """One drafter state (a copy of the module) and its rows in batch order (by row key)."""

    model: Any
    order: list[Hashable] = field(default_factory=list)
    # The rows that took this round's draft_block drafts as their own (by row key).
    asked: set[Hashable] = field(default_factory=set)


class ModelDrafter:
    """A loaded drafter bound to the target, and its rows' drafter states: one batch for every
    row where mlx-vlm's drafter accepts ragged batches (`supports_ragged_batch_acceptance`, or
    `requires_uniform_batch_acceptance` False: EAGLE-3), else
    one state per row (its batched accept needs every row to accept the same count)."""

    def __init__(self, model: Any, kind: str, target: Any, capture_layer_ids: Sequence[int] = ()) -> None:
        self.kind = kind
        # The target layers whose hidden states the drafter reads, side by side (EAGLE-3's three);
        # none: the last hidden states (the MTP heads).
        self.capture_layer_ids = tuple(capture_layer_ids)
        self._model = model
        self._target = target
        # Ragged batched accepts: declared (Qwen3.5's MTP head), or a drafter whose batched
        # accept does not need uniform counts (EAGLE-3's right-pads each row's tokens, and
        # mlx-vlm's own `_eagle3_rounds_batch` hands it ragged counts).
        self._shared = bool(getattr(model, "supports_ragged_batch_acceptance", False)) or (
            getattr(model, "requires_uniform_batch_acceptance", True) is False
        )
        self._batches: list[_DraftBatch] = []

    def bind(self, target: Any) -> None:
        """Draft with `target`'s embeddings and head (the weights may have been read again since:
        --idle-unload-seconds)."""
        if target is not self._target:
            self._model.bind(target)
            self._target = target
            self._batches = []

    def target_hidden(self, hidden_states: Sequence[Any]) -> Any:
        """The drafter's input from a forward's `hidden_states` (the captured layers in layer
        order, then the last): the captured ones side by side, else the last
        [rows, positions, hidden]."""
        import mlx.core as mx

        if not self.capture_layer_ids:
            return hidden_states[-1]
        return mx.concatenate(list(hidden_states[: len(self.capture_layer_ids)]), axis=-1)

    def _batch_of(self, row: DrafterRow) -> _DraftBatch | None:
        return next((batch for batch in self._batches if row.key in batch.order), None)

    def forget(self, row: DrafterRow) -> None:
        batch = self._batch_of(row)
        if batch is None:
            return
        index = batch.order.index(row.key)
        del batch.order[index]
        batch.asked.discard(row.key)
        if not batch.order:
            self._batches.remove(batch)
            return
        import mlx.core as mx

        keep = [i for i in range(len(batch.order) + 1) if i != index]
        batch.model.filter_batch(mx.array(keep, dtype=mx.int32))

    def ready(self, row: DrafterRow) -> bool:
        """Whether the row's drafter has a seed (it followed at least one forward)."""
        return self._batch_of(row) is not None

    def propose(self, rows: Sequence[DrafterRow], counts: Sequence[int]) -> list[list[int]]:
        """Up to `counts[i]` drafts for each ready row: one `draft_block` per drafter state with
        a row asking (the shared batch: every row it holds drafts the longest count asked, each
        asking row takes its own first ones), all evaluated together."""
        import mlx.core as mx

        wanted: dict[Hashable, int] = {}
        for row, count in zip(rows, counts, strict=True):
            wanted[row.key] = count
        blocks = []
        for batch in self._batches:
            asked = [key for key in batch.order if key in wanted]
            if not asked:
                continue
            batch.asked = set(asked)
            # draft_block proposes block_size - 1 tokens, the seed (the drafter's token after the
            # last one taken) first: its bonus and hidden arguments are for a first round only.
            size = max(wanted[key] for key in asked) + 1
            blocks.append((batch, batch.model.draft_block(0, None, None, size, None, greedy=True)))
        mx.eval([block for _, block in blocks])
        drafted: dict[Hashable, list[int]] = {}
        for batch, block in blocks:
            drafted.update(zip(batch.order, block.tolist(), strict=True))
        return [drafted[row.key][:count] for row, count in zip(rows, counts, strict=True)]

    def follow(
        self, verified: Sequence[tuple[int, DrafterRow, Sequence[int], Sequence[int]]], hidden: Any
    ) -> None:
        """A forward's outcome, per row (its index in the forward, the row, its drafts, the tokens
        it took: accepted drafts + the target's next), with the target's last hidden states
        [rows, width, hidden]. A row follows every forward it is in, whatever proposed its drafts:
        each drafter state's rows in one batched accept, joining rows alone (then they join)."""
        by_key = {entry[1].key: (entry[0], entry[2], entry[3]) for entry in verified}
        for batch in self._batches:
            self._accept_batch(batch, [by_key[key] for key in batch.order], hidden)
        for index, row, row_drafts, row_tokens in verified:
            if self._batch_of(row) is None:
                model = self._start(row)
                self._accept_alone(model, hidden[index : index + 1], row_drafts, row_tokens)
                self._join(row, model)

    @staticmethod
    def _accept_batch(
        batch: _DraftBatch, rows: list[tuple[int, Sequence[int], Sequence[int]]], hidden: Any
    ) -> None:
        import mlx.core as mx

        model = batch.model
        appended = int(model._round_appended)
        if appended and len(batch.asked) < len(batch.order):
            # A row that did not take this round's drafts (lookup or the grammar drafted it, or
            # nothing): its drafter positions are not its tokens'. Trim the round for every row;
            # the accept below replays each row's accepted drafts with the target's states.
            for layer in model._cache:
                layer.trim(appended)
            model._next_position = model._next_position - appended
            model._round_appended = 0
        batch.asked = set()
        if len(rows) == 1:  # every drafter's single-row accept (a batched one is not everywhere)
            index, row_drafts, row_tokens = rows[0]
            ModelDrafter._accept_alone(model, hidden[index : index + 1], row_drafts, row_tokens)
            return
        width = max(1, max(len(row_drafts) for _, row_drafts, _ in rows))
        drafts = mx.array(
            [[*row_drafts, *([0] * (width - len(row_drafts)))] for _, row_drafts, _ in rows], dtype=mx.int32
        )
        model.accept_verified_tokens_batch(
            hidden[mx.array([index for index, _, _ in rows], dtype=mx.int32)],
            drafts,
            [len(row_tokens) - 1 for _, _, row_tokens in rows],
            [[int(row_tokens[-1])] for _, _, row_tokens in rows],
            None,
            greedy=True,
        )

    @staticmethod
    def _accept_alone(model: Any, hidden: Any, row_drafts: Sequence[int], row_tokens: Sequence[int]) -> None:
        import mlx.core as mx

        model.accept_verified_tokens(
            hidden,
            mx.array([list(row_drafts)], dtype=mx.int32).reshape(1, len(row_drafts)),
            len(row_tokens) - 1,
            [int(row_tokens[-1])],
            None,
            greedy=True,
        )

    def _join(self, row: DrafterRow, model: Any) -> None:
        """A row's own drafter state (one row, seeded) becomes a batch, or joins the shared one."""
        import mlx.core as mx
        from mlx_vlm.models.cache import BatchKVCache

        if not self._shared:
            self._batches.append(_DraftBatch(model, [row.key]))
            return
        caches = [BatchKVCache.merge([layer]) for layer in model._cache]  # type: ignore[no-untyped-call]
        position = mx.array([model._next_position], dtype=mx.int32).reshape(1)
        if not self._batches:
            model._cache, model._next_position = caches, position
            self._batches.append(_DraftBatch(model, [row.key]))
            return
        batch = self._batches[0]
        shared = batch.model
        for mine, theirs in zip(shared._cache, caches, strict=True):
            mine.extend(theirs)
        shared._next_position = mx.concatenate([shared._next_position, position])
        shared._seed_token = mx.concatenate([shared._seed_token, model._seed_token])
        shared._seed_hidden = mx.concatenate([shared._seed_hidden, model._seed_hidden])
        batch.order.append(row.key)

    def _start(self, row: DrafterRow) -> Any:
        """A joining row's drafter, over the prompt's hidden states where the row kept them."""
        import mlx.core as mx

        model = copy.copy(self._model)  # shares the weights; reset() gives it its own state
        model.reset(self._target)
        prompt, generated = row.context_tokens
        kept = row.take_prompt_hidden()
        if kept is not None and len(generated) == 1:  # its first decode step: the token after the prompt
            start, hidden = kept
            ids = mx.array([list(prompt[start:])], dtype=mx.int32)
            model.prefill_from_target_hidden(ids, hidden, int(generated[0]), None, greedy=True)
        return model


# A loaded drafter model, whichever kind.
AnyDrafter: TypeAlias = "ModelDrafter | DFlashDrafter"


def load_model_drafter(path: str, target: Any) -> AnyDrafter:
    """mlx-vlm's drafter at `path` for the loaded `target` (its whole model)."""
    from mlx_vlm.speculative.drafters import load_drafter, validate_drafter_compatibility

    from vlmserve.engine.speculation.dflash_drafter import DFlashDrafter, check_dflash_drafter

    model: Any
    try:
        model, kind = load_drafter(path)
    except (OSError, ValueError) as error:
        raise DraftModelError(f"--draft-model {path}: {error}") from error
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if kind not in SUPPORTED_KINDS:
        raise DraftModelError(
            f"--draft-model {path}: a {kind} drafter (model_type {model_type}) is not supported: "
            f"not a kind this engine knows; supported kinds: {', '.join(SUPPORTED_KINDS)}"
        )
    dtype = target.language_model.model.embed_tokens.weight.dtype
    drafter: AnyDrafter
    try:
        validate_drafter_compatibility(target, model, kind)
        if kind == "dflash":
            check_dflash_drafter(path, model, target)
            # The target's dtype (float32 on a CPU, see model.py): the hidden states it hands
            # over. Before binding: the bound embeddings are the target's own.
            model.set_dtype(dtype)
            drafter = DFlashDrafter(model, target)
        else:
            captured = _eagle3_layers(path, model, target) if kind == "eagle3" else ()
            model.bind(target)
            model.set_dtype(dtype)
            drafter = ModelDrafter(model, kind, target, captured)
    except DraftModelError:
        raise
    except (AttributeError, ValueError) as error:
        raise DraftModelError(f"--draft-model {path}: {error}") from error
    log.info("draft model %s: %s drafter (model_type %s)", path, kind, model_type)
    return drafter


def _eagle3_layers(path: str, model: Any, target: Any) -> tuple[int, ...]:
    """The target layers an EAGLE-3 drafter reads (its config's `capture_layer_ids`, as mlx-vlm's
    `_eagle3_capture_layer_ids`), in layer order; refused when the target cannot give them."""
    layers = len(target.language_model.model.layers)
    wanted = [int(i) for i in model.config.capture_layer_ids]
    if any(not 0 <= i < layers for i in wanted):
        raise DraftModelError(
            f"--draft-model {path}: the drafter reads target layers {wanted}, the target has {layers}"
        )
    captured = tuple(sorted(set(wanted)))
    target_hidden = int(target.language_model.model.embed_tokens.weight.shape[1])
    width = int(model.fc.weight.shape[1])
    if len(captured) * target_hidden != width:
        raise DraftModelError(
            f"--draft-model {path}: the drafter reads {width // max(1, target_hidden)} target hidden states "
            f"of {target_hidden}, its capture_layer_ids {wanted} give {len(captured)} (target hidden size "
            f"{target_hidden}, the drafter's fc takes {width})"
        )
    return captured
