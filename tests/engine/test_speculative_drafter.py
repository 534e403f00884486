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

import dataclasses
import json
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import Event, FinishedEvent, Job, JobKind, PreparedRequest
from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.model import RANDOM_MODEL_PATH
from vlmserve.engine.speculation.model_drafter import DraftModelError, ModelDrafter
from vlmserve.engine.speculation.rollback import RecurrentVerify
from vlmserve.engine.v1 import engine_pb2 as pb

from ._logits_hooks import with_hooks
from .test_batching import AtToken
from .test_engine_grpc import text_part
from .test_speculation import _chi_square_critical, _chi_square_homogeneity
from .test_speculative_decoding import _generator, _requests

# Engines compared with `off`: the drafter alone, lookup + drafter, lookup alone.
MODES = ("draft", "auto", "lookup")


@dataclasses.dataclass
class _RecordedJob(Job):
    """A job that keeps its events (the engine's own jobs send them nowhere)."""

    seen: list[Event] = dataclasses.field(default_factory=list)

    def emit(self, event: Event) -> None:
        self.seen.append(event)

    @property
    def result(self) -> pb.GenerateResult:
        finished = [event for event in self.seen if isinstance(event, FinishedEvent)]
        assert len(finished) == 1, self.seen
        return finished[0].result


@pytest.fixture(scope="module")
def engines(drafter_models: dict[str, tuple[Path, Path]]) -> Iterator[dict[str, Generator]]:
    target, drafter = drafter_models["qwen3_5"]
    generators = {
        mode: _generator(
            mode,
            target,
            max_active=16,
            max_queue=64,
            draft_model=str(drafter) if mode in ("draft", "auto") else None,
        )
        for mode in ("off", *MODES)
    }
    yield generators
    for generator in generators.values():
        generator.stop()


def _run(generator: Generator, requests: dict[str, PreparedRequest], tag: str) -> dict[str, _RecordedJob]:
    jobs = {
        name: _RecordedJob(dataclasses.replace(request, request_id=f"{tag}-{name}"), None)
        for name, request in requests.items()
    }
    for job in jobs.values():
        generator.submit(job)
    assert generator.wait_idle(300)
    return jobs


def _tokens(generator: Generator, job: Job) -> tuple[int, ...]:
    reports = {report.request_id: report for report in generator.reports}
    return reports[job.request_id].token_ids


def _logprobs(result: pb.GenerateResult) -> list[tuple[tuple[str, ...], list[float]]]:
    """Per token: (its text and its alternatives', their logprobs)."""
    return [
        (
            (entry.token, *(alternative.token for alternative in entry.top_logprobs)),
            [entry.logprob, *(alternative.logprob for alternative in entry.top_logprobs)],
        )
        for entry in result.logprobs
    ]


def _count(generator: Generator, name: str, source: str) -> float:
    value = generator.metrics.registry.get_sample_value(
        f"vlmserve_engine_speculative_{name}_total", {"source": source}
    )
    return value or 0.0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_drafter_rows_take_the_tokens_they_take_without_speculation(
    engines: dict[str, Generator], temperature: float
) -> None:
    plain = engines["off"]
    requests = _requests(plain, temperature)
    before = {
        mode: {name: _count(engines[mode], name, "draft") for name in ("drafted_tokens", "accepted_tokens")}
        for mode in MODES
    }
    expected = {
        name: _run(plain, {name: request}, f"alone-{temperature}")[name] for name, request in requests.items()
    }
    for mode in MODES:
        generator = engines[mode]
        alone = {
            name: _run(generator, {name: request}, f"alone-{temperature}")[name]
            for name, request in requests.items()
        }
        together = _run(generator, requests, f"mixed-{temperature}")
        for name in requests:
            want = _tokens(plain, expected[name])
            assert _tokens(generator, alone[name]) == want, (mode, name)
            assert _tokens(generator, together[name]) == want, (mode, name)
            assert together[name].result.usage == expected[name].result.usage, (mode, name)
        # Logprobs are the target's: the same tokens and alternatives, the same numbers (to float
        # rounding: a batch of other rows and widths sums in another order).
        want_logprobs = _logprobs(expected["logprobs"].result)
        assert want_logprobs
        got = _logprobs(together["logprobs"].result)
        assert [entry[0] for entry in got] == [entry[0] for entry in want_logprobs], mode
        flat = [value for entry in got for value in entry[1]]
        assert flat == pytest.approx([value for entry in want_logprobs for value in entry[1]], abs=1e-4), mode
        json.loads(together["schema"].result.text)  # the constrained row still validates
    for mode in ("draft", "auto"):
        drafted = _count(engines[mode], "drafted_tokens", "draft") - before[mode]["drafted_tokens"]
        accepted = _count(engines[mode], "accepted_tokens", "draft") - before[mode]["accepted_tokens"]
        assert drafted > 0, mode
        if mode == "draft":  # every source but the grammar's is the drafter: accepted and rejected
            assert 0 < accepted < drafted
    # Per source: lookup drafts nothing in draft mode; the drafter nothing in lookup mode.
    assert _count(engines["draft"], "drafted_tokens", "lookup") == 0
    assert _count(engines["lookup"], "drafted_tokens", "draft") == 0
    assert _count(engines["auto"], "drafted_tokens", "lookup") > 0
    assert _count(engines["draft"], "drafted_tokens", "grammar") > 0


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
    _run(engines["draft"], {"copy": requests["copy"], "short": requests["short"]}, "prompt-start")
    assert len(started) == 2
    assert all(prompt > 1 and offset == prompt for prompt, offset in started), started


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_rows_leaving_mid_verify_change_no_other_row(
    engines: dict[str, Generator], monkeypatch: pytest.MonkeyPatch, temperature: float
) -> None:
    """Rows with different max tokens end at different steps, each while the next verify
    forward is in flight: the recurrent layers drop them only at that verify's commit
    (RecurrentVerify), and every row still takes its plain tokens."""
    commits: list[tuple[int, int]] = []  # (rows at launch, rows at commit)
    original = RecurrentVerify.commit

    def commit(self: RecurrentVerify, rows: Any, kept: Any) -> None:
        commits.append((len(self._rows), len(rows)))
        original(self, rows, kept)

    monkeypatch.setattr(RecurrentVerify, "commit", commit)
    base = _requests(engines["off"], temperature)
    requests = {
        f"{name}-{limit}": dataclasses.replace(
            request, settings=dataclasses.replace(request.settings, max_tokens=limit)
        )
        for name, request in base.items()
        for limit in (7, 13, 22)
    }
    expected = _run(engines["off"], requests, f"leaving-{temperature}")
    drafted = _run(engines["draft"], requests, f"leaving-{temperature}")
    for name in requests:
        assert _tokens(engines["draft"], drafted[name]) == _tokens(engines["off"], expected[name]), name
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
    base = _requests(engines["off"], 0.0)

    def longer(request: PreparedRequest, max_tokens: int) -> PreparedRequest:
        return dataclasses.replace(
            request, settings=dataclasses.replace(request.settings, max_tokens=max_tokens)
        )

    early = {"copy": longer(base["copy"], 400), "list": base["list"]}
    late = {"short": base["short"], "copy-late": dataclasses.replace(base["copy"], request_id="copy-late")}
    pacer = base["schema"]  # a constrained row (one token a step, hooked: no drafts)
    expected = {
        name: _tokens(engines["off"], _run(engines["off"], {name: request}, "join-alone")[name])
        for name, request in {**early, **late, "pacer": pacer}.items()
    }
    drafting = engines["draft"]
    jobs = {
        name: Job(dataclasses.replace(req, request_id=f"join-{name}"), None) for name, req in early.items()
    }
    late_jobs = {
        name: Job(dataclasses.replace(req, request_id=f"join-{name}"), None) for name, req in late.items()
    }

    def submit_late() -> None:
        for job in late_jobs.values():
            drafting.submit(job)

    hooked = with_hooks(
        pacer, AtToken(3, submit_late), AtToken(12, jobs["copy"].cancel), request_id="join-pacer"
    )
    jobs["pacer"] = Job(hooked, None)
    for job in jobs.values():
        drafting.submit(job)
    threading.Event().wait(0.05)
    assert drafting.wait_idle(300)
    jobs.update(late_jobs)
    reports = {report.request_id: report for report in drafting.reports}
    for name, job in jobs.items():
        report = reports[job.request_id]
        if name == "copy":  # cancelled mid-decode: what it took is its plain output's beginning
            assert report.finish_reason == pb.FINISH_REASON_CANCELLED
            assert 0 < len(report.token_ids) < len(expected[name])
            assert report.token_ids == expected[name][: len(report.token_ids)]
        else:
            assert report.token_ids == expected[name], name
    assert drafting._runner is not None
    model_drafter = drafting._runner.batch.speculator.model_drafter  # type: ignore[union-attr]
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
        speculator = per_row._runner.batch.speculator
        assert speculator is not None and isinstance(speculator.model_drafter, ModelDrafter)
        speculator.model_drafter._shared = False  # as for a drafter without ragged acceptance
        requests = _requests(engines["off"], 0.0)
        expected = _run(engines["off"], requests, "per-row")
        drafted = _run(per_row, requests, "per-row")
        for name in requests:
            assert _tokens(per_row, drafted[name]) == _tokens(engines["off"], expected[name]), name
        assert _count(per_row, "accepted_tokens", "draft") > 0
        assert max(states) >= 2, states
    finally:
        per_row.stop()


@pytest.mark.slow
def test_seeded_sampling_through_the_drafter_keeps_the_target_distribution(
    engines: dict[str, Generator],
) -> None:
    """Over many seeds (different ones on each side), the third token's distribution with the
    drafter is the plain engine's (chi-square homogeneity; the first tokens steer the drafts)."""
    plain, drafting = engines["off"], engines["draft"]
    assert plain.preparer is not None and drafting.preparer is not None
    seeds = 400

    def request(preparer: object, seed: int) -> PreparedRequest:
        prepared: PreparedRequest = preparer.prepare(  # type: ignore[attr-defined]
            pb.GenerateRequest(
                request_id=f"seed-{seed}",
                messages=[pb.Message(role=pb.ROLE_USER, parts=[text_part("Count: one two one two one")])],
                sampling=pb.SamplingParams(max_tokens=4, temperature=0.7, top_k=8, seed=seed),
            ),
            kind=JobKind.GENERATE,
        )
        return prepared

    def third_tokens(generator: Generator, first_seed: int) -> Counter[int]:
        counts: Counter[int] = Counter()
        for start in range(first_seed, first_seed + seeds, 40):  # within the engine's queue
            requests = {str(seed): request(generator.preparer, seed) for seed in range(start, start + 40)}
            for job in _run(generator, requests, f"dist-{start}").values():
                tokens = _tokens(generator, job)
                if len(tokens) > 2:
                    counts[tokens[2]] += 1
        return counts

    drafted = _count(drafting, "drafted_tokens", "draft")
    plain_counts, drafted_counts = third_tokens(plain, 0), third_tokens(drafting, 100_000)
    assert _count(drafting, "drafted_tokens", "draft") > drafted
    statistic, dof = _chi_square_homogeneity(plain_counts, drafted_counts)
    assert dof >= 1
    assert statistic < _chi_square_critical(dof), (statistic, dof, plain_counts, drafted_counts)


def test_the_target_checkpoints_own_mtp_head_is_the_same_drafter(
    engines: dict[str, Generator], drafter_models: dict[str, tuple[Path, Path]]
) -> None:
    """`--draft-model` on the target's own directory (its `mtp.*` tensors, as Qwen3.5 ships
    them: mlx-vlm's native-checkpoint splitter) drafts exactly as the split-out head does."""
    target, _ = drafter_models["qwen3_5"]
    native = _generator("draft", target, draft_model=str(target))
    try:
        requests = _requests(engines["off"], 0.0)
        split = _run(engines["draft"], requests, "split-head")
        own = _run(native, requests, "own-head")
        for name in requests:
            assert _tokens(native, own[name]) == _tokens(engines["draft"], split[name]), name
        assert _count(native, "accepted_tokens", "draft") > 0
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
