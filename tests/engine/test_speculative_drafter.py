"""mlx-vlm's drafter models (`--draft-model`) in the batched engine are lossless: on the Qwen3.5
fixture (Gated DeltaNet + attention) with its MTP head (training/families/qwen3_5.py), every
request generates exactly the tokens it generates with `--speculative off` — greedy and seeded,
alone and in a mixed batch (drafter rows, lookup rows, plain rows, a constrained row, a logprobs
row) — its logprobs are the target's, seeded sampling keeps the target's distribution over many
seeds, and the metrics say which source drafted and how much was accepted.

The same runs cover prompt lookup on a model with recurrent layers, whose rejected positions mlx-
vlm's cache transaction rolls back (speculation/rollback.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vlmserve.engine.config import EngineConfig
from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.model import RANDOM_MODEL_PATH
from vlmserve.engine.speculation.model_drafter import DraftModelError, ModelDrafter

from . import _drafter_scenarios as scenarios
from .test_speculative_decoding import _generator, _requests

# Engines compared with `off`: the drafter alone, lookup + drafter, lookup alone.
MODES = ("draft", "auto", "lookup")


@pytest.fixture(scope="module")
def engines(drafter_models: dict[str, tuple[Path, Path]]) -> Iterator[dict[str, Generator]]:
    yield from scenarios.started_engines(*drafter_models["qwen3_5"], MODES)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_drafter_rows_take_the_tokens_they_take_without_speculation(
    engines: dict[str, Generator], temperature: float
) -> None:
    before = {mode: scenarios.draft_counts(engines[mode]) for mode in MODES}
    batch = scenarios.MixedBatch.on(engines["off"], temperature)
    for mode in MODES:
        generator = engines[mode]
        alone = batch.alone(generator)
        together = batch.together(generator)
        batch.check_tokens(generator, alone, together, mode)
        batch.check_logprobs(together, mode)
        json.loads(together["schema"].result.text)  # the constrained row still validates
    for mode in ("draft", "auto"):
        drafted, accepted = scenarios.drafted_since(engines[mode], before[mode])
        assert drafted > 0, mode
        if mode == "draft":  # every source but the grammar's is the drafter: accepted and rejected
            assert 0 < accepted < drafted
    # Per source: lookup drafts nothing in draft mode; the drafter nothing in lookup mode.
    assert scenarios.count(engines["draft"], "drafted_tokens", "lookup") == 0
    assert scenarios.count(engines["lookup"], "drafted_tokens", "draft") == 0
    assert scenarios.count(engines["auto"], "drafted_tokens", "lookup") > 0
    assert scenarios.count(engines["draft"], "drafted_tokens", "grammar") > 0


def test_a_row_drafter_starts_over_the_prompt(
    engines: dict[str, Generator], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A row's drafter is prefilled from the prompt's hidden states (mlx-vlm's
    `prefill_from_target_hidden`): its KV cache covers every prompt position."""
    started: list[tuple[int, int]] = []
    original = ModelDrafter._start

    def start(self: ModelDrafter, row: Any) -> Any:
        model = original(self, row)
        started.append((len(row.context_tokens[0]), int(model._cache[0].offset)))
        return model

    monkeypatch.setattr(ModelDrafter, "_start", start)
    requests = _requests(engines["draft"], 0.0)
    scenarios.run(engines["draft"], {"copy": requests["copy"], "short": requests["short"]}, "prompt-start")
    assert len(started) == 2
    assert all(prompt > 1 and offset == prompt for prompt, offset in started), started


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_leaving_mid_verify_change_no_other_row(
    engines: dict[str, Generator], monkeypatch: pytest.MonkeyPatch, temperature: float
) -> None:
    """Rows with different max tokens end at different steps, each while the next verify
    forward is in flight: the recurrent layers drop them only at that verify's commit
    (RecurrentVerify), and every row still takes its plain tokens."""
    commits = scenarios.record_commits(monkeypatch)
    scenarios.check_rows_leaving_mid_verify(engines, temperature)
    assert any(at_commit < at_launch for at_launch, at_commit in commits), commits


def _held(drafter: ModelDrafter) -> int:
    """Rows the drafter holds a drafter state for."""
    return sum(len(batch.order) for batch in drafter._batches)


def test_one_batched_drafter_serves_rows_that_join_and_leave(
    engines: dict[str, Generator], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The drafter drafts for all its rows in one batched forward (model_drafter.py): rows join
    its batch while others are drafting, a cancelled drafting row leaves it mid-batch, and every
    row still takes exactly its tokens without speculation (greedy)."""
    held: list[tuple[int, int]] = []  # per propose: (rows asking, rows the drafter holds)
    joined_into: list[int] = []  # rows already held when another joined
    left_from: list[int] = []  # rows held when one left
    propose, join, forget = ModelDrafter.propose, ModelDrafter._join, ModelDrafter.forget

    def recorded_propose(self: ModelDrafter, rows: Any, counts: Any) -> list[list[int]]:
        held.append((len(rows), _held(self)))
        return propose(self, rows, counts)

    def recorded_join(self: ModelDrafter, row: object, model: Any) -> None:
        joined_into.append(_held(self))
        join(self, row, model)

    def recorded_forget(self: ModelDrafter, row: object) -> None:
        if self.ready(row):
            left_from.append(_held(self))
        forget(self, row)

    monkeypatch.setattr(ModelDrafter, "propose", recorded_propose)
    monkeypatch.setattr(ModelDrafter, "_join", recorded_join)
    monkeypatch.setattr(ModelDrafter, "forget", recorded_forget)
    drafting = engines["draft"]
    scenarios.check_join_and_cancel_while_drafting(engines["off"], drafting)
    assert drafting._runner is not None
    model_drafter = drafting._runner.batch.verifier.model_drafter  # type: ignore[union-attr]
    assert isinstance(model_drafter, ModelDrafter) and model_drafter._shared  # qwen3_5's MTP head: one batch
    assert any(asking >= 2 for asking, _ in held), held  # one drafter forward, several rows' drafts
    assert any(count >= 1 for count in joined_into), joined_into  # joined a drafting batch
    assert any(count >= 2 for count in left_from), left_from  # left with others still held


def test_a_drafter_without_ragged_batches_keeps_a_state_per_row(
    engines: dict[str, Generator],
    drafter_models: dict[str, tuple[Path, Path]],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A drafter whose batched accept needs every row to accept the same count (mlx-vlm's
    `requires_uniform_batch_acceptance` MTP heads) drafts with one state per row: the same tokens."""
    states: list[int] = []  # drafter states at each propose
    propose = ModelDrafter.propose

    def recorded_propose(self: ModelDrafter, rows: Any, counts: Any) -> list[list[int]]:
        states.append(len(self._batches))
        return propose(self, rows, counts)

    monkeypatch.setattr(ModelDrafter, "propose", recorded_propose)
    target, drafter = drafter_models["qwen3_5"]
    per_row = _generator("draft", target, max_active=16, max_queue=64, draft_model=str(drafter))
    try:
        assert per_row._runner is not None
        verifier = per_row._runner.batch.verifier
        assert verifier is not None and isinstance(verifier.model_drafter, ModelDrafter)
        verifier.model_drafter._shared = False  # as for a drafter without ragged acceptance
        requests = _requests(engines["off"], 0.0)
        scenarios.check_same_tokens(engines["off"], per_row, requests, "per-row")
        assert scenarios.count(per_row, "accepted_tokens", "draft") > 0
        assert max(states) >= 2, states
    finally:
        per_row.stop()


@pytest.mark.slow
def test_seeded_sampling_through_the_drafter_keeps_the_target_distribution(
    engines: dict[str, Generator],
) -> None:
    """Over many seeds (different ones on each side), the third token's distribution with the
    drafter is the plain engine's (chi-square homogeneity; the first tokens steer the drafts)."""
    scenarios.check_seeded_distribution(engines)


def test_the_target_checkpoints_own_mtp_head_is_the_same_drafter(
    engines: dict[str, Generator], drafter_models: dict[str, tuple[Path, Path]]
) -> None:
    """`--draft-model` on the target's own directory (its `mtp.*` tensors, as Qwen3.5 ships
    them: mlx-vlm's native-checkpoint splitter) drafts exactly as the split-out head does."""
    target, _ = drafter_models["qwen3_5"]
    native = _generator("draft", target, draft_model=str(target))
    try:
        requests = _requests(engines["off"], 0.0)
        scenarios.check_same_tokens(engines["draft"], native, requests, "own-head")
        assert scenarios.count(native, "accepted_tokens", "draft") > 0
    finally:
        native.stop()


def test_a_draft_model_that_cannot_serve_the_model_fails_the_load_with_why(
    drafter_models: dict[str, tuple[Path, Path]],
) -> None:
    target, _ = drafter_models["qwen3_5"]
    # Not a drafter: mlx-vlm's auto-detection falls back to its default kind, DFlash; the load
    # fails saying it is no drafter.
    config = EngineConfig(
        model=str(target), speculative="auto", draft_model=str(RANDOM_MODEL_PATH), warmup=False
    )
    failed: list[BaseException | None] = []
    generator = Generator(config)
    generator.start(on_ready=lambda loaded, error: failed.append(error))
    generator.join(120)  # a failed load ends the generation thread
    assert not generator.ready.is_set()
    assert failed and failed[0] is generator.load_error
    assert isinstance(generator.load_error, DraftModelError)
    assert "is not a drafter" in str(generator.load_error)


def test_speculative_draft_needs_a_draft_model() -> None:
    with pytest.raises(ValueError, match="--speculative draft needs --draft-model"):
        EngineConfig(speculative="draft")
