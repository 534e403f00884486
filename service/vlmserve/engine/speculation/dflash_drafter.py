"""mlx-vlm's DFlash drafters (`--draft-model`: `qwen3_dflash`, `dflash2`, `dspark`, ...), per row,
in our batched verify step.

A DFlash drafter reads the hidden states of chosen target layers (its config's
`target_layer_ids`): the target returns them from every prefill chunk and verify forward when
asked with `capture_layer_ids` (mlx-vlm's speculative target protocol, `capture_layer_ids` +
`return_hidden`: the captured layers in layer order, then the last hidden states), concatenated
along the hidden axis as mlx-vlm's `_dflash_rounds` concatenates them. Its state is a KV cache of
its context (the target's hidden states at committed positions, projected by `fc`); each round
`draft_block` appends the positions committed since the last round to it and proposes a block
([the latest token, mask, mask, ...], non-causal) whose own keys are never stored. So a
rejected draft leaves nothing to roll back in the drafter: only committed positions (a row's
latest token and its accepted drafts, whatever proposed them) are ever fed to it. The target's
rejected positions are rolled back as for every verify (rollback.py).

Wrapped where mlx-vlm's round loops fall short of our rows:
- `_dflash_rounds_batch` fixes its rows when the loop starts and drafts every row the same block
  size; ours join at any step and draft from the grammar, lookup or the drafter, each its own
  count. Each row keeps its own drafter state (a `make_cache()` and the committed hidden states
  not fed yet), created at its first verify from the prompt's captured hidden states (when the
  row ran its prompt itself; the last `PROMPT_HIDDEN_POSITIONS`, after any cached prefix) and
  that verify's; a row that drafts from lookup for a while has its committed positions fed in
  batches (`FEED_POSITIONS`) so they do not pile up.
- mlx-vlm's batched loop drafts one `draft_block` per row ("the DFlash drafter cache is
  scalar-offset and has proven unsafe as a single batched cache"); here the rows keep their own
  caches and one drafter forward drafts for all of them (dflash_batch.py: per-row rotary
  offsets, left-padded keys and a mask; each row its own block size), for mlx-vlm's plain
  DFlash layers; other DFlash kinds keep one `draft_block` per row, evaluated together.
- The block size is the row's count + 1 (policy.py's adaptive length), not mlx-vlm's
  `_dflash_next_block_size` schedule; the drafter's trained `block_size` caps it.

Drafts are the drafter's argmax (`draft_block_greedy` where the target has a fused argmax), so
the acceptance rule's draft distribution is one-hot for every row, greedy or sampled.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

from vlmserve.engine.speculation.dflash_batch import batched_hidden, supports_batched
from vlmserve.engine.speculation.drafter_row import DrafterRow, DraftModelError

__all__ = ["DFlashDrafter", "check_dflash_drafter"]

log = logging.getLogger(__name__)

# Committed positions a row collects before they are fed to its drafter without a draft (a row
# lookup drafts for): the hidden states of several layers per position are large.
FEED_POSITIONS = 32


@dataclass
class _RowState:
    cache: list[Any]
    # The latest token (the next round's block starts with it) and the committed positions'
    # captured hidden states not fed to the drafter yet ([1, n, layers x hidden] each).
    token: int
    pending: list[Any] = field(default_factory=list)

    @property
    def pending_positions(self) -> int:
        return sum(int(hidden.shape[1]) for hidden in self.pending)

    def take_pending(self) -> Any:
        """The pending hidden states as one array [1, n, layers x hidden] (there are some)."""
        import mlx.core as mx

        pending, self.pending = self.pending, []
        return pending[0] if len(pending) == 1 else mx.concatenate(pending, axis=1)


def _argmax(logits: Any) -> Any:
    import mlx.core as mx

    return mx.argmax(logits, axis=-1)


def check_dflash_drafter(path: str, model: Any, target: Any) -> None:
    """Refuse a DFlash-kind drafter this engine cannot run, or one that does not fit `target`
    (mlx-vlm's own checks first, then what the forward would otherwise fail on later)."""
    from mlx_vlm.speculative.drafters.compatibility import validate_dflash_target
    from mlx_vlm.speculative.drafters.qwen3_dflash import DFlashDraftModel

    model_type = getattr(model.config, "model_type", None)
    if not type(model).__module__.startswith("mlx_vlm.speculative.drafters."):
        raise DraftModelError(
            f"--draft-model {path}: model_type {model_type} is not a drafter (mlx-vlm's auto-detection "
            "fell back to its default kind, dflash); a dflash drafter's config has a dflash_config"
        )
    if not isinstance(model, DFlashDraftModel) or callable(getattr(model, "prepare_target_hidden", None)):
        raise DraftModelError(
            f"--draft-model {path}: the dflash drafter {type(model).__name__} (model_type {model_type}) "
            "is not supported: its context state (rotating caches, prepared target hidden states) is "
            "not mlx-vlm's DFlashDraftModel's, whose draft_block and context feeding this engine "
            "drives per row (untested on others); supported: qwen3_dflash, dflash2, dspark"
        )
    try:
        validate_dflash_target(model.config, target, "DFlash")
    except ValueError as error:
        raise DraftModelError(f"--draft-model {path}: {error}") from error
    layers = len(target.language_model.model.layers)
    ids = list(model.config.target_layer_ids)
    if not ids or any(not 0 <= i < layers for i in ids):
        raise DraftModelError(
            f"--draft-model {path}: the drafter reads target layers {ids}, the target has {layers}"
        )
    if not 0 <= int(model.config.mask_token_id) < int(model.config.vocab_size):
        raise DraftModelError(
            f"--draft-model {path}: mask_token_id {model.config.mask_token_id} is outside the "
            f"vocabulary ({model.config.vocab_size})"
        )


class DFlashDrafter:
    """A loaded DFlash drafter bound to the target, and one drafter state per row it follows."""

    kind = "dflash"

    def __init__(self, model: Any, target: Any) -> None:
        self._model = model
        self._target = target
        # Whether the checkpoint carries its own embeddings (else the target's, bound anew on a
        # reload: mlx-vlm's `bind` keeps the first ones it was given).
        self._own_embeddings = model.embed_tokens is not None
        model.bind(target)
        self.capture_layer_ids = tuple(sorted(int(i) for i in model.config.target_layer_ids))
        self.block_size = int(getattr(model.config, "runtime_block_size", None) or model.config.block_size)
        self._rows: dict[Hashable, _RowState] = {}
        # One drafter forward for all drafting rows (dflash_batch.py) where the drafter's
        # layers are mlx-vlm's plain DFlash ones; else one per row.
        self._batched = supports_batched(model)
        # Drafter forwards run so far (each `draft_block`, context feed or batched forward).
        self.forwards = 0

    def bind(self, target: Any) -> None:
        """Draft with `target`'s embeddings and head (the weights may have been read again since:
        --idle-unload-seconds)."""
        if target is self._target:
            return
        if not self._own_embeddings:
            self._model.embed_tokens = None
        self._model.bind(target)
        self._target = target
        self._rows = {}

    def target_hidden(self, hidden_states: Sequence[Any]) -> Any:
        """The drafter's context from a forward's `hidden_states` (the captured layers, then the
        last): the captured layers side by side [rows, positions, layers x hidden]."""
        import mlx.core as mx

        captured = list(hidden_states[: len(self.capture_layer_ids)])
        return captured[0] if len(captured) == 1 else mx.concatenate(captured, axis=-1)

    def forget(self, row: DrafterRow) -> None:
        self._rows.pop(row.key, None)

    def ready(self, row: DrafterRow) -> bool:
        """Whether the row has a drafter state (it followed at least one forward)."""
        return row.key in self._rows

    def propose(self, rows: Sequence[DrafterRow], counts: Sequence[int]) -> list[list[int]]:
        """Up to `counts[i]` drafts for each ready row: one drafter forward for all of them
        (dflash_batch.py; a `draft_block` per row, evaluated together, for the drafters it does
        not batch), each row's block its latest token then masks, over its context."""
        import mlx.core as mx

        model = self._model
        drafting: list[tuple[int, _RowState, int, Any]] = []
        for index, (row, count) in enumerate(zip(rows, counts, strict=True)):
            state = self._rows[row.key]
            # Every forward feeds a row its latest token's position, so a ready row has context
            # to draft from; none (never seen): no drafts.
            if state.pending:
                drafting.append((index, state, min(count, self.block_size - 1) + 1, state.take_pending()))
        drafts: list[Any] = [None] * len(rows)
        if self._batched and len(drafting) > 1:
            hidden = batched_hidden(
                model,
                [state.token for _, state, _, _ in drafting],
                [size for _, _, size, _ in drafting],
                [fresh for _, _, _, fresh in drafting],
                [state.cache for _, state, _, _ in drafting],
            )
            self.forwards += 1
            block = self._argmax_drafts(hidden[:, 1:])
            for row_index, (index, _, size, _) in enumerate(drafting):
                drafts[index] = block[row_index, : size - 1]
        else:
            draft = getattr(model, "draft_block_greedy", model.draft_block)
            for index, state, size, fresh in drafting:
                drafts[index] = draft(state.token, fresh, state.cache, size, _argmax)
                self.forwards += 1
        mx.eval(
            [block for block in drafts if block is not None],
            [layer.state for _, state, _, _ in drafting for layer in state.cache],
        )
        return [[] if block is None else block.reshape(-1).tolist() for block in drafts]

    def _argmax_drafts(self, hidden: Any) -> Any:
        """The drafter's argmax tokens at its block's hidden states, as `draft_block_greedy`
        takes them (the target's fused argmax where it has one)."""
        model = self._model
        if callable(model.argmax_from_hidden):
            return model.argmax_from_hidden(hidden)
        return _argmax(model._logits(hidden))

    def follow(
        self, verified: Sequence[tuple[int, DrafterRow, Sequence[int], Sequence[int]]], hidden: Any
    ) -> None:
        """A forward's outcome, per row (its index in the forward, the row, its drafts, the tokens
        it took: accepted drafts + the target's next), with the forward's captured hidden states
        [rows, width, layers x hidden]: each row's committed positions (its latest token and its
        accepted drafts) join its drafter's context; a new row's drafter starts over the prompt."""
        import mlx.core as mx

        feed = []
        for index, row, _drafts, tokens in verified:
            committed = hidden[index : index + 1, : len(tokens)]
            state = self._rows.get(row.key)
            if state is None:
                state = self._start(row)
            state.pending.append(committed)
            state.token = int(tokens[-1])
            if state.pending_positions >= FEED_POSITIONS:
                feed.append(state)
        if feed:  # the context only: a one-token block, its output unused
            if self._batched and len(feed) > 1:
                batched_hidden(
                    self._model,
                    [state.token for state in feed],
                    [1] * len(feed),
                    [state.take_pending() for state in feed],
                    [state.cache for state in feed],
                )
                self.forwards += 1
            else:
                for state in feed:
                    self._model._hidden(
                        mx.array([[state.token]], dtype=mx.int32), state.take_pending(), state.cache
                    )
                    self.forwards += 1
            mx.eval([layer.state for state in feed for layer in state.cache])

    def _start(self, row: DrafterRow) -> _RowState:
        """A joining row's drafter state, over the prompt's hidden states where the row kept them."""
        state = _RowState(self._model.make_cache(), 0)
        self._rows[row.key] = state
        _prompt, generated = row.context_tokens
        kept = row.take_prompt_hidden()
        if kept is not None and len(generated) == 1:  # its first decode step: the token after the prompt
            state.pending.append(kept[1])
        return state
