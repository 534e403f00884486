"""Speculative decoding on quantized KV caches (`--kv-bits 8|4`, uniform and turboquant) is
lossless: with `--speculative lookup` every request generates exactly the tokens (and usage) it
generates with `--speculative off` at the same precision — greedy and seeded sampling, alone and
in a mixed batch (lookup rows, a plain row, a json_schema row, a logprobs row, two rows on one
prompt sharing its KV in flight, a row that joins mid-decode and one cancelled mid-decode) — and
the drafts really were verified on the quantized cache (the speculation metrics grew; rejected
drafts were rolled back: kv/rollback.py `roll_back_batch`, unit-tested in test_kv_rollback.py).

One limit, and it is the batch's, not speculation's: a mixed batch rounds a row's forward a
little differently from the row alone (~3e-6 in the logits here), and a quantized cache rounds
each stored value to its grid — a 4-bit group's 16 levels, turboquant's float16 norm per vector —
so such a difference sometimes moves a stored value by one step and the logits by up to ~1e-3
(test_kv_quantized.py `QUANTIZED_ATOL`, `TURBO_4_ATOL`). Speculation changes which rows a token
is computed beside, so a seeded row in a mixed batch on a quantized cache may part from its run
alone at a near tie of its sampled distribution (seen once in CI: a 4-bit row at its third
token). Those rows are held to: the same tokens up to where they part, and every logits row up
to there within that rounding. Everything else is exact: greedy rows, and seeded rows alone (a
verify forward's logits are bitwise the steps' it replaces: kv/rollback.py `verify_forward`)."""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest

from vlmserve.engine.jobs import Job, JobKind, JobReport, PreparedRequest
from vlmserve.engine.loop.draw import TokenDraw
from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.v1 import engine_pb2 as pb

from ._logits_hooks import with_hooks
from ._runs import run, run_each_alone
from ._step_gate import verify_every_step
from .test_batching import AtToken
from .test_engine_grpc import text_part
from .test_kv_quantized import QUANTIZED_ATOL, TURBO_4_ATOL
from .test_speculative_decoding import MAX_TOKENS, _counter, _generator, _requests, bytes_text

pytestmark = pytest.mark.needs_model

LAYOUTS = {
    "8-bit": {"kv_bits": 8},
    "4-bit": {"kv_bits": 4},
    "turboquant-4-bit": {"kv_bits": 4, "kv_quant_scheme": "turboquant"},
}


@pytest.fixture(scope="module", params=list(LAYOUTS.values()), ids=list(LAYOUTS))
def generators(request: pytest.FixtureRequest) -> Iterator[tuple[Generator, Generator]]:
    # A low position cost (Apple silicon's): drafts are verified in a batch of eight rows too,
    # also the seeded rows' rarer matches.
    settings = {
        "prefill_chunk_tokens": 32,
        "step_tokens": 48,
        "speculative_position_cost": 0.01,
        **request.param,
    }
    plain, speculative = _generator("off", **settings), _generator("lookup", **settings)
    for generator in (plain, speculative):
        assert generator.loaded is not None and generator.loaded.kv_layout.quantized
    yield plain, speculative
    plain.stop()
    speculative.stop()


Seen = dict[str, dict[int, np.ndarray]]


@pytest.fixture
def seen(monkeypatch: pytest.MonkeyPatch) -> Seen:
    """Every request's logits for each of its tokens (by request id, then token index), as its
    draw saw them: a plain step's and each judged position of a verify forward alike. Read-only:
    a row keeps drafting (a logits processor would stop it)."""
    rows: Seen = {}
    processed = TokenDraw.processed_logits

    def recording(draw: TokenDraw, logits: Any, drafts: Any = ()) -> Any:
        index = len(draw.generated) + len(drafts)
        rows.setdefault(draw.request.request_id, {})[index] = np.array(logits[0])
        return processed(draw, logits, drafts)

    monkeypatch.setattr(TokenDraw, "processed_logits", recording)
    # Every row's logits pass through `processed_logits`, those of rows without processors too
    # (they would skip it: draw.py `sample_rows`); for them it returns the logits unchanged.
    monkeypatch.setattr(TokenDraw, "processes", property(lambda draw: True))
    return rows


def _assert_same_tokens(report: JobReport, expected: JobReport, seen: Seen, *, parting_atol: float) -> None:
    """The same tokens and usage; with `parting_atol` (a seeded row in a mixed batch: the
    layout's logits tolerance, 0 where none) the tokens may part, where the logits up to there
    differ only by batch rounding."""
    assert report.output_tokens == expected.output_tokens, report.request_id
    tokens, reference = report.token_ids, expected.token_ids
    parted = next((i for i, (a, b) in enumerate(zip(tokens, reference, strict=False)) if a != b), None)
    if parted is None or not parting_atol:
        assert tokens == reference, report.request_id
        return
    mine, theirs = seen[report.request_id], seen[expected.request_id]
    for index in range(parted + 1):
        np.testing.assert_allclose(
            mine[index], theirs[index], rtol=0, atol=parting_atol, err_msg=f"{report.request_id} @ {index}"
        )


def _prepared(generator: Generator, text: str, temperature: float, seed: int) -> PreparedRequest:
    assert generator.preparer is not None
    request = pb.GenerateRequest(
        request_id="r",
        messages=[pb.Message(role=pb.ROLE_USER, parts=[text_part(text)])],
        sampling=pb.SamplingParams(max_tokens=MAX_TOKENS, temperature=temperature, seed=seed),
    )
    return generator.preparer.prepare(request, kind=JobKind.GENERATE)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_speculation_on_quantized_kv_changes_no_token(
    generators: tuple[Generator, Generator], temperature: float, seen: Seen
) -> None:
    plain, speculative = generators
    requests = _requests(plain, temperature)
    drafted = _counter(speculative, "speculative_drafted_tokens")
    accepted = _counter(speculative, "speculative_accepted_tokens")
    expected = run_each_alone(plain, requests, f"q-alone-{temperature}")
    alone = run_each_alone(speculative, requests, f"q-spec-alone-{temperature}")
    together = run(speculative, requests, f"q-mixed-{temperature}")
    parting = _parting_atol(speculative) if temperature > 0 else 0
    for name in requests:
        _assert_same_tokens(alone[name], expected[name], seen, parting_atol=0)
        _assert_same_tokens(together[name], expected[name], seen, parting_atol=parting)
    assert _counter(speculative, "speculative_drafted_tokens") > drafted
    assert _counter(speculative, "speculative_accepted_tokens") > accepted
    json.loads(bytes_text(speculative, together["schema"]))  # the constrained row still validates


def _parting_atol(generator: Generator) -> float:
    """How far a mixed batch may move a row's logits on this generator's quantized cache: a
    4-bit grid (16 levels, uniform or turboquant) steps further than an 8-bit one."""
    assert generator.loaded is not None
    return TURBO_4_ATOL if generator.loaded.kv_layout.bits == 4 else QUANTIZED_ATOL


def _run_with_join_and_cancel(
    generator: Generator, requests: dict[str, PreparedRequest], late: PreparedRequest, tag: str
) -> tuple[dict[str, JobReport], JobReport, JobReport]:
    """Every request together, plus a trigger row ("Hi.", no drafts: it runs a logits processor)
    that submits `late` when it has 6 tokens and cancels the "cancelled" row at 9."""
    jobs = {
        name: Job(dataclasses.replace(req, request_id=f"{tag}-{name}"), None)
        for name, req in requests.items()
    }
    late_job = Job(dataclasses.replace(late, request_id=f"{tag}-late"), None)
    trigger = with_hooks(
        dataclasses.replace(requests["short"], request_id=f"{tag}-trigger"),
        AtToken(6, lambda: generator.submit(late_job)),
        AtToken(9, jobs["cancelled"].cancel),
    )
    for job in [*jobs.values(), Job(trigger, None)]:
        generator.submit(job)
    threading.Event().wait(0.05)
    assert generator.wait_idle(300)
    reports = {report.request_id: report for report in generator.reports}
    return (
        {name: reports[job.request_id] for name, job in jobs.items()},
        reports[f"{tag}-late"],
        reports[f"{tag}-trigger"],
    )


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_a_join_and_a_cancel_on_quantized_kv_change_no_token(
    generators: tuple[Generator, Generator], temperature: float, seen: Seen, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Verifies whatever the step gate would choose from this machine's measured costs (it prices
    # a verify from the measured plain step, not the low prior position cost set above, and on
    # this CPU finds the mixed batch's drafts not worth one): what is tested is that verifying
    # on a quantized cache through a join and a cancel changes no token.
    verify_every_step(monkeypatch, prior_start_rate=False)
    plain, speculative = generators
    requests = _requests(plain, temperature)
    requests["cancelled"] = _prepared(plain, "Cancel me " * 5, temperature, seed=6)
    late = dataclasses.replace(requests["copy"], request_id="late")
    expected = run_each_alone(plain, {**requests, "late": late}, f"q-join-alone-{temperature}")
    rows = _counter(speculative, "speculative_verified_rows")
    mixed, joined, trigger = _run_with_join_and_cancel(speculative, requests, late, f"q-join-{temperature}")
    assert _counter(speculative, "speculative_verified_rows") > rows
    parting = _parting_atol(speculative) if temperature > 0 else 0
    _assert_same_tokens(trigger, expected["short"], seen, parting_atol=parting)
    _assert_same_tokens(joined, expected["late"], seen, parting_atol=parting)
    for name, report in mixed.items():
        if name == "cancelled":
            assert report.finish_reason == pb.FINISH_REASON_CANCELLED
            assert 1 <= report.output_tokens < MAX_TOKENS
            assert report.token_ids == expected[name].token_ids[: report.output_tokens]
            continue
        _assert_same_tokens(report, expected[name], seen, parting_atol=parting)
    # "copy" and "logprobs" have one prompt: the later one starts from the earlier one's KV.
    assert max(mixed["copy"].cached_tokens, mixed["logprobs"].cached_tokens) > 0
