"""mlx-vlm's drafter models (`--draft-model`), one drafter state per batch row.

`load_drafter` (mlx-vlm's `speculative.drafters`) loads the checkpoint and auto-detects its kind
from its config as mlx-vlm's server does (`model_type`, an `mtp` name, `num_nextn_predict_layers`);
`validate_drafter_compatibility` checks it against the target. The drafting itself is mlx-vlm's
code: `draft_block` proposes a row's drafts, `accept_verified_tokens` feeds it the target's
hidden states for the tokens the row kept.

Wrapped where mlx-vlm falls short of batching with our rows: its drafter holds the state of one
batch (its own KV cache, the seed token and hidden state for the next round) whose rows are fixed
when a round loop starts (`filter_batch` drops rows, nothing adds one), and every row drafts the
same block. Our rows join and leave at any step and each drafts its own adaptive count, so each
row has its own copy of the drafter module (a shallow copy: the weights are shared, the state is
the row's). A row's drafter starts at its first decode step: from the prompt's hidden states when the row
ran its prompt itself (mlx-vlm's `prefill_from_target_hidden`; its last `PROMPT_HIDDEN_POSITIONS`
positions, after any cached prefix), else (a prompt run in a shared forward) from its first
token's, so its attention covers the output only. Drafts are the drafter's argmax, so the
acceptance rule's draft distribution is one-hot for every row, greedy or sampled (acceptance.py).

Kinds: `mtp` heads (Qwen3.5's and the other MTP drafters mlx-vlm maps to that kind). DFlash,
DSpark and EAGLE3 draft from hidden states of chosen target layers (`capture_layer_ids`) with a
round loop of their own; they are refused at load with what they need (docs/models.md).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

__all__ = ["DraftModelError", "ModelDrafter", "load_model_drafter"]

log = logging.getLogger(__name__)

SUPPORTED_KINDS = ("mtp",)


class DraftModelError(ValueError):
    """The draft model cannot serve this target (unknown kind, mismatched sizes, no weights)."""


class DrafterRow(Protocol):
    @property
    def context_tokens(self) -> tuple[Sequence[int], Sequence[int]]: ...

    def take_prompt_hidden(self) -> tuple[int, Any] | None: ...


@dataclass
class _RowDraft:
    model: Any  # the row's copy of the drafter module
    ready: bool = False  # has a seed (it followed at least one forward)


class ModelDrafter:
    """A loaded drafter bound to the target, and each row's state."""

    def __init__(self, model: Any, kind: str, target: Any) -> None:
        self.kind = kind
        self._model = model
        self._target = target
        self._rows: dict[int, _RowDraft] = {}

    def bind(self, target: Any) -> None:
        """Draft with `target`'s embeddings and head (the weights may have been read again since:
        --idle-unload-seconds)."""
        if target is not self._target:
            self._model.bind(target)
            self._target = target
            self._rows.clear()

    def forget(self, row: object) -> None:
        self._rows.pop(id(row), None)

    def ready(self, row: object) -> bool:
        state = self._rows.get(id(row))
        return state is not None and state.ready

    def propose(self, rows: Sequence[object], counts: Sequence[int]) -> list[list[int]]:
        """Up to `counts[i]` drafts for each ready row (one evaluation for all of them)."""
        import mlx.core as mx

        blocks = []
        for row, count in zip(rows, counts, strict=True):
            state = self._rows[id(row)]
            # draft_block proposes block_size - 1 tokens, the seed (the drafter's token after the
            # last one taken) first: its bonus and hidden arguments are for a first round only.
            blocks.append(state.model.draft_block(0, None, None, count + 1, None, greedy=True))
        mx.eval(blocks)
        return [[int(t) for t in block.reshape(-1).tolist()] for block in blocks]

    def follow(
        self, verified: Sequence[tuple[int, DrafterRow, Sequence[int], Sequence[int]]], hidden: Any
    ) -> None:
        """A forward's outcome, per row (its index in the forward, the row, its drafts, the tokens
        it took: accepted drafts + the target's next), with the target's last hidden states
        [rows, width, hidden]. A row follows every forward it is in, whatever proposed its drafts."""
        import mlx.core as mx

        for index, row, row_drafts, row_tokens in verified:
            state = self._rows.get(id(row))
            if state is None:
                state = self._rows[id(row)] = _RowDraft(self._start(row))
            accepted = len(row_tokens) - 1
            state.model.accept_verified_tokens(
                hidden[index : index + 1],
                mx.array([list(row_drafts)], dtype=mx.int32).reshape(1, len(row_drafts)),
                accepted,
                [int(row_tokens[-1])],
                None,
                greedy=True,
            )
            state.ready = True

    def _start(self, row: DrafterRow) -> Any:
        """A new row's drafter, over the prompt's hidden states where the row kept them."""
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


def load_model_drafter(path: str, target: Any) -> ModelDrafter:
    """mlx-vlm's drafter at `path` for the loaded `target` (its whole model)."""
    from mlx_vlm.speculative.drafters import load_drafter, validate_drafter_compatibility

    model: Any
    try:
        model, kind = load_drafter(path)
    except (OSError, ValueError) as error:
        raise DraftModelError(f"--draft-model {path}: {error}") from error
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    if kind not in SUPPORTED_KINDS:
        raise DraftModelError(
            f"--draft-model {path}: a {kind} drafter (model_type {model_type}) is not supported: "
            "it drafts from hidden states of chosen target layers with its own round loop; "
            f"supported kinds: {', '.join(SUPPORTED_KINDS)}"
        )
    try:
        validate_drafter_compatibility(target, model, kind)
        model.bind(target)
        # The target's dtype (float32 on a CPU, see model.py): the hidden states it hands over.
        model.set_dtype(target.language_model.model.embed_tokens.weight.dtype)
    except (AttributeError, ValueError) as error:
        raise DraftModelError(f"--draft-model {path}: {error}") from error
    log.info("draft model %s: %s drafter (model_type %s)", path, kind, model_type)
    return ModelDrafter(model, kind, target)
