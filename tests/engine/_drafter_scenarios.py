"""What the drafter suite (MTP heads, DFlash, EAGLE-3: test_speculative_drafters.py) runs alike on
each kind of drafter: jobs that keep their events, the mixed batch run alone and together against
`--speculative off`, rows leaving mid-verify, rows joining and a cancelled row leaving while
others draft, and the seeded-distribution check. The suite adds what is particular to a drafter
(what it records and asserts of the drafter itself).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import Event, FinishedEvent, Job, JobKind, PreparedRequest
from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.speculation.model_drafter import DraftModelError
from vlmserve.engine.speculation.rollback import RecurrentVerify
from vlmserve.engine.v1 import engine_pb2 as pb

from ._logits_hooks import with_hooks
from ._runs import report_of, run, run_jobs, run_jobs_each_alone
from .test_batching import AtToken
from .test_engine_grpc import text_part
from .test_speculation import _chi_square_critical, _chi_square_homogeneity
from .test_speculative_decoding import _generator, _requests


@dataclasses.dataclass
class RecordedJob(Job):
    """A job that keeps its events (the engine's own jobs send them nowhere)."""

    seen: list[Event] = dataclasses.field(default_factory=list)

    def emit(self, event: Event) -> None:
        self.seen.append(event)

    @property
    def result(self) -> pb.GenerateResult:
        finished = [event for event in self.seen if isinstance(event, FinishedEvent)]
        assert len(finished) == 1, self.seen
        return finished[0].result


def check_same_tokens(
    reference: Generator, generator: Generator, requests: dict[str, PreparedRequest], tag: str
) -> None:
    """Every request takes on `generator` exactly the tokens it takes on `reference`."""
    expected = run(reference, requests, tag)
    got = run(generator, requests, tag)
    for name in requests:
        assert got[name].token_ids == expected[name].token_ids, name


def logprobs(result: pb.GenerateResult) -> list[tuple[tuple[str, ...], list[float]]]:
    """Per token: (its text and its alternatives', their logprobs)."""
    return [
        (
            (entry.token, *(alternative.token for alternative in entry.top_logprobs)),
            [entry.logprob, *(alternative.logprob for alternative in entry.top_logprobs)],
        )
        for entry in result.logprobs
    ]


def count(generator: Generator, name: str, source: str) -> float:
    value = generator.metrics.registry.get_sample_value(
        f"vlmserve_engine_speculative_{name}_total", {"source": source}
    )
    return value or 0.0


DRAFT_COUNTS = ("drafted_tokens", "accepted_tokens")


def draft_counts(generator: Generator) -> dict[str, float]:
    """The drafter's drafted and accepted tokens so far."""
    return {name: count(generator, name, "draft") for name in DRAFT_COUNTS}


def drafted_since(generator: Generator, before: dict[str, float]) -> tuple[float, float]:
    """(drafted, accepted) drafter tokens since `before` (`draft_counts`)."""
    now = draft_counts(generator)
    drafted, accepted = (now[name] - before[name] for name in DRAFT_COUNTS)
    return drafted, accepted


@dataclasses.dataclass
class MixedBatch:
    """The mixed request set (test_speculative_decoding.py `_requests`), each run alone on the
    plain engine: what every row must take on an engine that speculates."""

    plain: Generator
    temperature: float
    requests: dict[str, PreparedRequest]
    expected: dict[str, RecordedJob]

    @classmethod
    def on(cls, plain: Generator, temperature: float) -> MixedBatch:
        requests = _requests(plain, temperature)
        return cls(
            plain,
            temperature,
            requests,
            run_jobs_each_alone(plain, requests, f"alone-{temperature}", RecordedJob),
        )

    def alone(self, generator: Generator) -> dict[str, RecordedJob]:
        return run_jobs_each_alone(generator, self.requests, f"alone-{self.temperature}", RecordedJob)

    def together(self, generator: Generator) -> dict[str, RecordedJob]:
        return run_jobs(generator, self.requests, f"mixed-{self.temperature}", RecordedJob)

    def check_tokens(
        self, generator: Generator, alone: dict[str, RecordedJob], together: dict[str, RecordedJob], mode: str
    ) -> None:
        """Every row takes its plain tokens alone and together, and its plain usage together."""
        for name in self.requests:
            want = report_of(self.plain, self.expected[name]).token_ids
            assert report_of(generator, alone[name]).token_ids == want, (mode, name)
            assert report_of(generator, together[name]).token_ids == want, (mode, name)
            assert together[name].result.usage == self.expected[name].result.usage, (mode, name)

    def check_logprobs(self, together: dict[str, RecordedJob], mode: str) -> None:
        # Logprobs are the target's: the same tokens and alternatives, the same numbers (to float
        # rounding: a batch of other rows and widths sums in another order).
        want_logprobs = logprobs(self.expected["logprobs"].result)
        assert want_logprobs
        got = logprobs(together["logprobs"].result)
        assert [entry[0] for entry in got] == [entry[0] for entry in want_logprobs], mode
        flat = [value for entry in got for value in entry[1]]
        assert flat == pytest.approx([value for entry in want_logprobs for value in entry[1]], abs=1e-4), mode


def with_max_tokens(base: dict[str, PreparedRequest], limits: tuple[int, ...]) -> dict[str, PreparedRequest]:
    """Each request once per max-tokens limit, named `{name}-{limit}`."""
    return {
        f"{name}-{limit}": dataclasses.replace(
            request, settings=dataclasses.replace(request.settings, max_tokens=limit)
        )
        for name, request in base.items()
        for limit in limits
    }


def record_commits(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int]]:
    """Per recurrent verify commit: (rows at launch, rows at commit)."""
    commits: list[tuple[int, int]] = []
    original = RecurrentVerify.commit

    def commit(self: RecurrentVerify, rows: Any, kept: Any) -> None:
        commits.append((len(self._rows), len(rows)))
        original(self, rows, kept)

    monkeypatch.setattr(RecurrentVerify, "commit", commit)
    return commits


def check_rows_leaving_mid_verify(engines: dict[str, Generator], temperature: float) -> None:
    """Rows with different max tokens end at different steps, each while the next verify forward
    is in flight: every row on `draft` still takes its tokens on `off`."""
    requests = with_max_tokens(_requests(engines["off"], temperature), (7, 13, 22))
    check_same_tokens(engines["off"], engines["draft"], requests, f"leaving-{temperature}")


def check_join_and_cancel_while_drafting(plain: Generator, drafting: Generator) -> None:
    """Rows join `drafting` while others are drafting (submitted when a paced row reaches its
    third token) and a drafting row is cancelled mid-decode (at the paced row's twelfth); every
    row still takes exactly its tokens on `plain` (greedy), the cancelled one their beginning."""
    base = _requests(plain, 0.0)

    def longer(request: PreparedRequest, max_tokens: int) -> PreparedRequest:
        return dataclasses.replace(
            request, settings=dataclasses.replace(request.settings, max_tokens=max_tokens)
        )

    early = {"copy": longer(base["copy"], 400), "list": base["list"]}
    late = {"short": base["short"], "copy-late": dataclasses.replace(base["copy"], request_id="copy-late")}
    pacer = base["schema"]  # a constrained row (one token a step, hooked: no drafts)
    expected = {
        name: run(plain, {name: request}, "join-alone")[name].token_ids
        for name, request in {**early, **late, "pacer": pacer}.items()
    }
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


def check_seeded_distribution(engines: dict[str, Generator]) -> None:
    """The third token's distribution over 400 seeds per side, `draft` against `off`."""
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
            for report in run(generator, requests, f"dist-{start}").values():
                taken = report.token_ids
                if len(taken) > 2:
                    counts[taken[2]] += 1
        return counts

    drafted = count(drafting, "drafted_tokens", "draft")
    plain_counts, drafted_counts = third_tokens(plain, 0), third_tokens(drafting, 100_000)
    assert count(drafting, "drafted_tokens", "draft") > drafted
    statistic, dof = _chi_square_homogeneity(plain_counts, drafted_counts)
    assert dof >= 1
    assert statistic < _chi_square_critical(dof), (statistic, dof, plain_counts, drafted_counts)


def check_load_fails(
    target: Path, drafter: Path, tmp_path: Path, edit: Callable[[dict[str, Any]], None], why: str
) -> None:
    """A copy of `drafter` whose config.json `edit` changes fails the load of `target` with it as
    the `--draft-model`, saying `why`."""
    broken = tmp_path / "drafter"
    shutil.copytree(drafter, broken)
    config = json.loads((broken / "config.json").read_text(encoding="utf-8"))
    edit(config)
    (broken / "config.json").write_text(json.dumps(config), encoding="utf-8")
    settings = EngineConfig(model=str(target), speculative="draft", draft_model=str(broken), warmup=False)
    generator = Generator(settings)
    generator.start(on_ready=lambda loaded, error: None)
    generator.join(120)  # a failed load ends the generation thread
    assert not generator.ready.is_set()
    assert isinstance(generator.load_error, DraftModelError)
    assert why in str(generator.load_error)


def started_engines(
    target: Path, drafter: Path, modes: tuple[str, ...], drafting: tuple[str, ...] = ("draft", "auto")
) -> Iterator[dict[str, Generator]]:
    """For a module fixture: `off` and an engine per mode on `target`, `drafter` the draft model of
    those in `drafting`; all stopped once the module is done."""
    generators = {
        mode: _generator(
            mode,
            target,
            max_active=16,
            max_queue=64,
            draft_model=str(drafter) if mode in drafting else None,
        )
        for mode in ("off", *modes)
    }
    yield generators
    for generator in generators.values():
        generator.stop()
