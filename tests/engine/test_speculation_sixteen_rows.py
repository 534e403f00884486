"""Prompt lookup at 16 concurrent copying rows (issue 37.1): the step gate verifies their drafts
when a verify step pays for itself and runs plain steps when it does not, on the random fixture
(its greedy loops give lookup drafts that are accepted), tokens identical to `--speculative off`
either way.

What a step costs is the one thing scripted (the verifier's clock, `StepClock._elapsed`): the
bench measures it on this CPU, where a step of 16 rows moves with the other jobs on the machine,
so a test of the decision feeds it the costs of two backends instead — one where a verify step
costs little more than a plain one (a memory-bound decode: Apple silicon, a GPU) and one where
it costs three plain steps whatever its width. Before the fix, the prior position cost
(0.065 × 16 rows per extra position) cut every 16-row verify to width 1 before any wider one was
ever measured, so lookup never drafted at 16 streams whatever the costs.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from vlmserve.engine.jobs import PreparedRequest
from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.speculation.step_clock import StepClock

from ._runs import run
from .test_speculative_decoding import _counter, _generator

pytestmark = pytest.mark.needs_model

ROWS = 16
MAX_TOKENS = 64
PLAIN_SECONDS = 0.1


@pytest.fixture(scope="module")
def plain() -> Iterator[Generator]:
    generator = _generator("off", max_active=ROWS, max_queue=ROWS)
    yield generator
    generator.stop()


@pytest.fixture
def lookup() -> Iterator[Generator]:
    """A fresh engine per case: its step gate learns the case's costs from nothing."""
    generator = _generator("lookup", max_active=ROWS, max_queue=ROWS)
    yield generator
    generator.stop()


def _copying(generator: Generator) -> dict[str, PreparedRequest]:
    """16 greedy requests, each asked to copy a JSON record of its own."""
    from vlmserve.engine.jobs import JobKind
    from vlmserve.engine.v1 import engine_pb2 as pb

    from .test_engine_grpc import text_part

    assert generator.preparer is not None
    requests = {}
    for i in range(ROWS):
        record = json.dumps({"name": f"row{i}", "count": 40 + i, "tags": ["x", str(i)]})
        request = pb.GenerateRequest(
            request_id=f"copy{i}",
            messages=[pb.Message(role=pb.ROLE_USER, parts=[text_part(f"Copy: {record} {record}")])],
            sampling=pb.SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, seed=i),
        )
        requests[f"copy{i}"] = generator.preparer.prepare(request, kind=JobKind.GENERATE)
    return requests


def _clock(verify_seconds: Callable[[int], float]) -> Callable[[tuple[float, int, int], float], float]:
    """`StepClock._elapsed` with a step's cost from its kind instead of the wall clock: a plain
    step (width 0) PLAIN_SECONDS, a verify of width w `verify_seconds(w)`."""

    def elapsed(step: tuple[float, int, int], now: float) -> float:
        width = step[2]
        return PLAIN_SECONDS if width == 0 else verify_seconds(width)

    return elapsed


def _forwards(generator: Generator, kind: str) -> float:
    value = generator.metrics.registry.get_sample_value(
        "vlmserve_engine_decode_forwards_total", {"kind": kind}
    )
    return value or 0.0


def _run_counted(
    generator: Generator, requests: dict[str, PreparedRequest], tag: str
) -> tuple[dict[str, Any], dict[str, float]]:
    """The requests' reports, and the speculation counters this run moved."""
    names = ("speculative_drafted_tokens", "speculative_accepted_tokens", "speculative_verified_rows")
    before = {name: _counter(generator, name) for name in names}
    before |= {kind: _forwards(generator, kind) for kind in ("verify", "plain")}
    reports = run(generator, requests, tag)
    after = {name: _counter(generator, name) for name in names}
    after |= {kind: _forwards(generator, kind) for kind in ("verify", "plain")}
    return reports, {name: after[name] - before[name] for name in before}


# A verify step of width w (1 + drafts per row) on a backend where a decode step is memory-bound
# (it costs about what a plain step does), and on one where it is compute-bound (each extra
# position costs 1.5 plain steps: no row's accepted drafts can pay for it, a row gains at most
# one token per position).
MEMORY_BOUND = "memory-bound"
COMPUTE_BOUND = "compute-bound"
VERIFY_SECONDS: dict[str, Callable[[int], float]] = {
    MEMORY_BOUND: lambda width: PLAIN_SECONDS * (1.02 + 0.01 * width),
    COMPUTE_BOUND: lambda width: PLAIN_SECONDS * (2 + 1.5 * (width - 1)),
}


@pytest.mark.parametrize("backend", [MEMORY_BOUND, COMPUTE_BOUND])
def test_sixteen_copying_rows_verify_drafts_only_where_they_pay(
    plain: Generator, lookup: Generator, monkeypatch: pytest.MonkeyPatch, backend: str
) -> None:
    monkeypatch.setattr(StepClock, "_elapsed", staticmethod(_clock(VERIFY_SECONDS[backend])))
    requests = _copying(plain)
    expected = run(plain, requests, f"off-{backend}")
    # The first batch also measures what steps cost here (exploration: a few wide verifies
    # whatever they cost); the second shows the steady state.
    first, _ = _run_counted(lookup, requests, f"lookup-first-{backend}")
    got, moved = _run_counted(lookup, requests, f"lookup-{backend}")
    for key in requests:
        assert first[key].token_ids == expected[key].token_ids, (backend, key)
        assert got[key].token_ids == expected[key].token_ids, (backend, key)
    tokens = sum(len(report.token_ids) for report in got.values())
    assert tokens > ROWS * MAX_TOKENS / 2
    if backend == MEMORY_BOUND:
        # Drafts are verified at 16 rows: most steps verify and most tokens are accepted drafts.
        assert moved["verify"] > moved["plain"], moved
        assert moved["speculative_accepted_tokens"] > tokens / 2, moved
    else:
        # A probe now and then (and the trials its accepted drafts buy: 2 at most); the rest
        # are plain steps (double-buffered).
        assert moved["verify"] <= 6, moved
        assert moved["plain"] >= 3 * moved["verify"], moved
