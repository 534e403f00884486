"""mlx-vlm's drafter models (`--draft-model`) in the batched engine are lossless, one suite over
every kind: on the Qwen3.5 fixture (Gated DeltaNet + attention) with its MTP head, a DFlash
drafter reading both target layers' hidden states, and, on a 4-layer Qwen3.5, an EAGLE-3 drafter
reading three (training/families/qwen3_5.py `build_*_drafter`). Every request generates exactly
the tokens and usage it generates with `--speculative off` — greedy and seeded, alone and in a
mixed batch (drafter rows, lookup rows, plain rows, a constrained row, a logprobs row), rows
leaving mid-verify, rows joining and a cancelled row leaving while others draft — its logprobs
are the target's, seeded sampling keeps the target's distribution over many seeds, the metrics
say which source drafted and how much was accepted, and a drafter that does not fit the target
fails the load with why. What is particular to one kind follows the shared tests: the MTP head's
drafter starts over the prompt and serves without ragged batches, DFlash rows' drafter contexts
are exactly their committed positions, EAGLE-3's shared batch drafts what one state per row does.

The same runs cover prompt lookup on a model with recurrent layers, whose rejected positions mlx-
vlm's cache transaction rolls back (speculation/rollback.py).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests._fixture_models import RANDOM_MODEL_PATH
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.speculation.dflash_drafter import DFlashDrafter
from vlmserve.engine.speculation.model_drafter import DraftModelError, ModelDrafter

from . import _drafter_scenarios as scenarios
from ._runs import run
from ._step_gate import script_gate, verify_every_step
from .test_speculative_decoding import _generator, _requests


@dataclass(frozen=True)
class Kind:
    # The fixture pair in `drafter_models` (target, drafter).
    models: str
    # The engines compared with `off` (all but `lookup` take the drafter).
    modes: tuple[str, ...]
    # Whether a row's logprobs are checked to float rounding (else their tokens).
    exact_logprobs: bool = True
    # Whether seeded rows' drafts are both accepted and rejected too (else greedy ones only).
    accepts_and_rejects_sampled: bool = False


KINDS = {
    "mtp": Kind("qwen3_5", ("draft", "auto", "lookup"), accepts_and_rejects_sampled=True),
    "dflash": Kind("qwen3_5_dflash", ("draft", "auto")),
    "eagle3": Kind("qwen3_5_eagle3", ("draft", "auto"), exact_logprobs=False),
}


@pytest.fixture(autouse=True)
def verifying(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step the step gate is asked about verifies, widths come from the prior position cost
    and every row from the prior acceptance rate (speculation/step_cost.py decides from measured
    costs, which vary with the machine's load, and new rows start from the engine's recent rate,
    which varies with the tests before): the drafters' bookkeeping below holds while the batch
    verifies, and two engines draft alike; `test_plain_steps_between_verifies_change_no_token`
    scripts the gate."""
    verify_every_step(monkeypatch)


@pytest.fixture(scope="module", params=list(KINDS))
def kind(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


@pytest.fixture(scope="module")
def models(kind: str, drafter_models: dict[str, tuple[Path, Path]]) -> tuple[Path, Path]:
    return drafter_models[KINDS[kind].models]


@pytest.fixture(scope="module")
def engines(kind: str, models: tuple[Path, Path]) -> Iterator[dict[str, Generator]]:
    yield from scenarios.started_engines(*models, KINDS[kind].modes)


# -- every kind ------------------------------------------------------------------------------


def _context_positions(drafter: DFlashDrafter, row: Any) -> int:
    """Positions a DFlash row's drafter has been fed or holds to feed."""
    state = drafter._rows[row.key]
    return int(state.cache[0].offset) + state.pending_positions


@pytest.fixture
def contexts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """After every forward a DFlash drafter follows, per row: (prompt tokens, the tokens the
    target has taken for it, including this forward's, its drafter's context positions)."""
    seen: list[tuple[int, int, int]] = []
    follow = DFlashDrafter.follow

    def recorded(self: DFlashDrafter, verified: Any, hidden: Any) -> None:
        follow(self, verified, hidden)
        for _index, row, _drafts, tokens in verified:
            prompt, generated = row.context_tokens  # this forward's tokens are not drawn yet
            seen.append((len(prompt), len(generated) + len(tokens), _context_positions(self, row)))

    monkeypatch.setattr(DFlashDrafter, "follow", recorded)
    return seen


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_drafter_rows_take_the_tokens_they_take_without_speculation(
    kind: str, engines: dict[str, Generator], contexts: list[tuple[int, int, int]], temperature: float
) -> None:
    spec = KINDS[kind]
    before = {mode: scenarios.draft_counts(engines[mode]) for mode in spec.modes}
    batch = scenarios.MixedBatch.on(engines["off"], temperature)
    for mode in spec.modes:
        generator = engines[mode]
        contexts.clear()
        alone = batch.alone(generator)
        if kind == "dflash":
            # A row that ran its prompt alone: its drafter's context is its prompt and every
            # token the target has taken since but the latest (the next block starts with it), no
            # more: rejected drafts never reach it, whoever drafted them (lookup too: auto).
            assert contexts, mode
            assert all(fed == prompt + drawn - 1 for prompt, drawn, fed in contexts), (mode, contexts)
        contexts.clear()
        together = batch.together(generator)
        if kind == "dflash":
            # In a batch, a prompt run in a shared forward starts its drafter at its first token.
            assert all(fed in (prompt + drawn - 1, drawn - 1) for prompt, drawn, fed in contexts), (
                mode,
                contexts,
            )
        batch.check_tokens(generator, alone, together, mode)
        for name in batch.requests:
            assert alone[name].result.usage == batch.expected[name].result.usage, (mode, name)
        if spec.exact_logprobs:
            batch.check_logprobs(together, mode)
        else:
            got = scenarios.logprobs(together["logprobs"].result)
            want_logprobs = scenarios.logprobs(batch.expected["logprobs"].result)
            assert [entry[0] for entry in got] == [entry[0] for entry in want_logprobs], mode
        json.loads(together["schema"].result.text)  # the constrained row still validates
    for mode in ("draft", "auto"):
        drafted, accepted = scenarios.drafted_since(engines[mode], before[mode])
        assert drafted > 0, mode
        if mode == "draft" and (temperature == 0.0 or spec.accepts_and_rejects_sampled):
            # Every source but the grammar's is the drafter: accepted and rejected (the fixtures'
            # greedy loops).
            assert 0 < accepted < drafted, (accepted, drafted)
    # Per source: lookup drafts nothing in draft mode; the drafter nothing in lookup mode.
    assert scenarios.count(engines["draft"], "drafted_tokens", "lookup") == 0
    assert scenarios.count(engines["auto"], "drafted_tokens", "lookup") > 0
    assert scenarios.count(engines["draft"], "drafted_tokens", "grammar") > 0
    if "lookup" in engines:
        assert scenarios.count(engines["lookup"], "drafted_tokens", "draft") == 0
    assert engines["draft"]._runner is not None
    drafter = engines["draft"]._runner.batch.verifier.model_drafter  # type: ignore[union-attr]
    if kind == "eagle3":
        assert isinstance(drafter, ModelDrafter) and drafter.kind == "eagle3" and drafter._shared
        assert drafter.capture_layer_ids == (1, 2, 3)


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


@pytest.mark.slow
def test_seeded_sampling_through_the_drafter_keeps_the_target_distribution(
    engines: dict[str, Generator],
) -> None:
    """Over many seeds (different ones on each side), the third token's distribution with the
    drafter is the plain engine's (chi-square homogeneity; the first tokens steer the drafts)."""
    scenarios.check_seeded_distribution(engines)


# The drafter's class, the method a joining row's drafter state starts in, and the rows it holds.
_HOLDERS: dict[str, tuple[type[Any], str, Any]] = {
    "mtp": (ModelDrafter, "_join", lambda drafter: sum(len(batch.order) for batch in drafter._batches)),
    "dflash": (DFlashDrafter, "_start", lambda drafter: len(drafter._rows)),
}


@pytest.mark.parametrize("kind", list(_HOLDERS), indirect=True)
def test_rows_join_and_leave_while_others_draft(
    kind: str, engines: dict[str, Generator], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows join while others are drafting (the MTP head's one batched drafter state: model_drafter.py;
    DFlash's state per row) and a cancelled drafting row leaves mid-stream; every row still takes
    exactly its tokens without speculation (greedy)."""
    drafter_class, starts, held = _HOLDERS[kind]
    asking: list[int] = []  # rows per propose
    joined_into: list[int] = []  # rows held when another joined
    left_from: list[int] = []  # rows held when one left
    propose, start, forget = drafter_class.propose, getattr(drafter_class, starts), drafter_class.forget

    def recorded_propose(self: Any, rows: Any, counts: Any) -> list[list[int]]:
        asking.append(len(rows))
        result: list[list[int]] = propose(self, rows, counts)
        return result

    def recorded_start(self: Any, row: Any, *rest: Any) -> Any:
        joined_into.append(held(self))
        return start(self, row, *rest)

    def recorded_forget(self: Any, row: Any) -> None:
        if self.ready(row):
            left_from.append(held(self))
        forget(self, row)

    monkeypatch.setattr(drafter_class, "propose", recorded_propose)
    monkeypatch.setattr(drafter_class, starts, recorded_start)
    monkeypatch.setattr(drafter_class, "forget", recorded_forget)
    drafting = engines["draft"]
    scenarios.check_join_and_cancel_while_drafting(engines["off"], drafting)
    if kind == "mtp":
        assert drafting._runner is not None
        model_drafter = drafting._runner.batch.verifier.model_drafter  # type: ignore[union-attr]
        assert (
            isinstance(model_drafter, ModelDrafter) and model_drafter._shared
        )  # qwen3_5's MTP head: one batch
    assert any(count >= 2 for count in asking), asking  # one drafter round, several rows' drafts
    assert any(count >= 1 for count in joined_into), joined_into  # joined a drafting batch
    assert any(count >= 2 for count in left_from), left_from  # left with others still held


@pytest.mark.parametrize(
    ("kind", "change", "why"),
    [
        ("dflash", {"num_target_layers": 3}, "target layer-count mismatch: draft=3, target=2"),
        (
            "dflash",
            {"dflash_config": {"target_layer_ids": [0, 4]}},
            "reads target layers [0, 4], the target has 2",
        ),
        (
            "dflash",
            {"dflash_config": {"mask_token_id": 10**6}},
            "mask_token_id 1000000 is outside the vocabulary",
        ),
        (
            "eagle3",
            {"eagle_aux_hidden_state_layer_ids": [2, 3, 9]},
            "reads target layers [1, 2, 8], the target has 4",
        ),
        ("eagle3", {"eagle_aux_hidden_state_layer_ids": [3, 3, 4]}, "its capture_layer_ids [2, 2, 3] give 2"),
    ],
    indirect=["kind"],
)
def test_a_drafter_that_does_not_fit_the_target_fails_the_load_with_why(
    models: tuple[Path, Path], tmp_path: Path, change: dict[str, Any], why: str
) -> None:
    def edit(config: dict[str, Any]) -> None:
        for key, value in change.items():
            config[key] = {**config[key], **value} if isinstance(value, dict) else value

    scenarios.check_load_fails(*models, tmp_path, edit, why)


# -- the MTP head --------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["mtp"], indirect=True)
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
    run(engines["draft"], {"copy": requests["copy"], "short": requests["short"]}, "prompt-start")
    assert len(started) == 2
    assert all(prompt > 1 and offset == prompt for prompt, offset in started), started


@pytest.mark.parametrize("kind", ["mtp"], indirect=True)
def test_a_drafter_without_ragged_batches_keeps_a_state_per_row(
    engines: dict[str, Generator], models: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """A drafter whose batched accept needs every row to accept the same count (mlx-vlm's
    `requires_uniform_batch_acceptance` MTP heads) drafts with one state per row: the same tokens."""
    states: list[int] = []  # drafter states at each propose
    propose = ModelDrafter.propose

    def recorded_propose(self: ModelDrafter, rows: Any, counts: Any) -> list[list[int]]:
        states.append(len(self._batches))
        return propose(self, rows, counts)

    monkeypatch.setattr(ModelDrafter, "propose", recorded_propose)
    target, drafter = models
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


@pytest.mark.parametrize("kind", ["mtp"], indirect=True)
def test_the_target_checkpoints_own_mtp_head_is_the_same_drafter(
    engines: dict[str, Generator], models: tuple[Path, Path]
) -> None:
    """`--draft-model` on the target's own directory (its `mtp.*` tensors, as Qwen3.5 ships
    them: mlx-vlm's native-checkpoint splitter) drafts exactly as the split-out head does."""
    target, _ = models
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


# -- EAGLE-3 -------------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["eagle3"], indirect=True)
def test_eagle3_rows_batched_draft_what_a_state_per_row_drafts(
    engines: dict[str, Generator], models: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared drafter batch (rows joining and leaving, ragged accepts) proposes the drafts one
    drafter state per row proposes: the same drafts verified and accepted, the same tokens."""
    held: list[int] = []  # rows in the drafter's largest state, per propose
    propose = ModelDrafter.propose

    def recorded(self: ModelDrafter, rows: Any, counts: Any) -> list[list[int]]:
        held.append(max((len(batch.order) for batch in self._batches), default=0))
        return propose(self, rows, counts)

    monkeypatch.setattr(ModelDrafter, "propose", recorded)
    target, drafter = models
    requests = scenarios.with_max_tokens(_requests(engines["off"], 0.0), (7, 13, 40))
    per_row = _generator("draft", target, max_active=16, max_queue=64, draft_model=str(drafter))
    try:
        assert per_row._runner is not None and per_row._runner.batch.verifier is not None
        alone = per_row._runner.batch.verifier.model_drafter
        assert isinstance(alone, ModelDrafter)
        alone._shared = False
        counts = {}
        for name, generator in (("shared", engines["draft"]), ("per-row", per_row)):
            before = list(scenarios.draft_counts(generator).values())
            reports = run(generator, requests, f"batched-{name}")
            after = list(scenarios.draft_counts(generator).values())
            counts[name] = (
                [b - a for a, b in zip(before, after, strict=True)],
                {n: report.token_ids for n, report in reports.items()},
            )
            if name == "shared":
                assert max(held) >= 2, held
    finally:
        per_row.stop()
    assert counts["shared"] == counts["per-row"]
    assert counts["shared"][0][1] > 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_plain_steps_between_verifies_change_no_token(
    kind: str, engines: dict[str, Generator], monkeypatch: pytest.MonkeyPatch, temperature: float
) -> None:
    """Where the step gate chooses plain steps (a verify not worth its cost), the drafter's rows
    drop their states and start over when the batch verifies again: every request still takes
    the tokens it takes without speculation, alone and in a mixed batch."""
    script = iter([True, True, True, False, False] * 10_000)
    script_gate(monkeypatch, lambda: next(script))
    holder = ModelDrafter if kind != "dflash" else DFlashDrafter
    forgotten: list[object] = []
    forget = holder.forget

    def recorded_forget(self: Any, row: Any) -> None:
        forgotten.append(row.key)
        forget(self, row)

    monkeypatch.setattr(holder, "forget", recorded_forget)
    batch = scenarios.MixedBatch.on(engines["off"], temperature)
    before = scenarios.draft_counts(engines["draft"])
    alone = batch.alone(engines["draft"])
    together = batch.together(engines["draft"])
    batch.check_tokens(engines["draft"], alone, together, "draft")
    drafted, _ = scenarios.drafted_since(engines["draft"], before)
    assert drafted > 0
    # Rows dropped their drafter states at plain steps (more than the rows that ended).
    assert len(forgotten) > 2 * len(batch.requests), len(forgotten)
