"""mlx-vlm's DFlash drafters (`--draft-model`, speculation/dflash_drafter.py) in the batched engine
are lossless: on the Qwen3.5 fixture (Gated DeltaNet + attention) with a DFlash drafter reading
both target layers' hidden states (training/families/qwen3_5.py `build_dflash_drafter`), every
request generates exactly the tokens and usage it generates with `--speculative off` — greedy and
seeded, alone and in a mixed batch (drafter rows, lookup rows, plain rows, a constrained row, a
logprobs row), rows joining and leaving at any step — and each row's drafter context is exactly
its committed positions (never a rejected draft's). A drafter that does not fit the target fails
the load with why.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import threading
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import Job, JobKind, PreparedRequest
from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.speculation.dflash_drafter import DFlashDrafter
from vlmserve.engine.speculation.model_drafter import DraftModelError
from vlmserve.engine.speculation.rollback import RecurrentVerify
from vlmserve.engine.v1 import engine_pb2 as pb

from ._logits_hooks import with_hooks
from .test_batching import AtToken
from .test_engine_grpc import text_part
from .test_speculation import _chi_square_critical, _chi_square_homogeneity
from .test_speculative_decoding import _generator, _requests
from .test_speculative_drafter import _count, _logprobs, _run, _tokens

pytestmark = pytest.mark.needs_model

MODES = ("draft", "auto")


@pytest.fixture(scope="module")
def dflash(drafter_models: dict[str, tuple[Path, Path]]) -> tuple[Path, Path]:
    return drafter_models["qwen3_5_dflash"]


@pytest.fixture(scope="module")
def engines(dflash: tuple[Path, Path]) -> Iterator[dict[str, Generator]]:
    target, drafter = dflash
    generators = {
        mode: _generator(
            mode,
            target,
            max_active=16,
            max_queue=64,
            draft_model=str(drafter) if mode != "off" else None,
        )
        for mode in ("off", *MODES)
    }
    yield generators
    for generator in generators.values():
        generator.stop()


def _context_positions(drafter: DFlashDrafter, row: object) -> int:
    """Positions a row's drafter has been fed or holds to feed."""
    state = drafter._rows[id(row)]
    return int(state.cache[0].offset) + state.pending_positions


@pytest.fixture
def contexts(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, int, int]]:
    """After every forward a drafter follows, per row: (prompt tokens, the tokens the target has
    taken for it, including this forward's, its drafter's context positions)."""
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
def test_dflash_rows_take_the_tokens_they_take_without_speculation(
    engines: dict[str, Generator], contexts: list[tuple[int, int, int]], temperature: float
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
        contexts.clear()
        alone = {
            name: _run(generator, {name: request}, f"alone-{temperature}")[name]
            for name, request in requests.items()
        }
        # A row that ran its prompt alone: its drafter's context is its prompt and every token
        # the target has taken since but the latest (the next block starts with it), no more:
        # rejected drafts never reach it, whoever drafted them (lookup too: auto).
        assert contexts, mode
        assert all(fed == prompt + drawn - 1 for prompt, drawn, fed in contexts), (mode, contexts)
        contexts.clear()
        together = _run(generator, requests, f"mixed-{temperature}")
        # In a batch, a prompt run in a shared forward starts its drafter at its first token.
        assert all(fed in (prompt + drawn - 1, drawn - 1) for prompt, drawn, fed in contexts), (
            mode,
            contexts,
        )
        for name in requests:
            want = _tokens(plain, expected[name])
            assert _tokens(generator, alone[name]) == want, (mode, name)
            assert _tokens(generator, together[name]) == want, (mode, name)
            assert alone[name].result.usage == expected[name].result.usage, (mode, name)
            assert together[name].result.usage == expected[name].result.usage, (mode, name)
        want_logprobs = _logprobs(expected["logprobs"].result)
        assert want_logprobs
        got = _logprobs(together["logprobs"].result)
        assert [entry[0] for entry in got] == [entry[0] for entry in want_logprobs], mode
        flat = [value for entry in got for value in entry[1]]
        assert flat == pytest.approx([value for entry in want_logprobs for value in entry[1]], abs=1e-4), mode
        json.loads(together["schema"].result.text)  # the constrained row still validates
    drafted = _count(engines["draft"], "drafted_tokens", "draft") - before["draft"]["drafted_tokens"]
    accepted = _count(engines["draft"], "accepted_tokens", "draft") - before["draft"]["accepted_tokens"]
    assert drafted > 0
    if temperature == 0.0:  # the fixture's greedy loops: drafts accepted and rejected
        assert 0 < accepted < drafted, (accepted, drafted)
    assert _count(engines["draft"], "drafted_tokens", "lookup") == 0
    assert _count(engines["auto"], "drafted_tokens", "lookup") > 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_dflash_rows_leaving_mid_verify_change_no_other_row(
    engines: dict[str, Generator], monkeypatch: pytest.MonkeyPatch, temperature: float
) -> None:
    """Rows with different max tokens end at different steps, while the next verify forward is in
    flight (the recurrent layers drop them at that verify's commit); every row still takes its
    plain tokens."""
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


def test_dflash_rows_join_and_leave_while_others_draft(
    engines: dict[str, Generator], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Rows join while others are drafting and a cancelled drafting row leaves mid-stream; every
    row still takes exactly its tokens without speculation (greedy)."""
    asking: list[int] = []  # rows per propose
    joined_into: list[int] = []  # rows held when another joined
    left_from: list[int] = []  # rows held when one left
    propose, start, forget = DFlashDrafter.propose, DFlashDrafter._start, DFlashDrafter.forget

    def recorded_propose(self: DFlashDrafter, rows: Any, counts: Any) -> list[list[int]]:
        asking.append(len(rows))
        return propose(self, rows, counts)

    def recorded_start(self: DFlashDrafter, row: Any) -> Any:
        joined_into.append(len(self._rows))
        return start(self, row)

    def recorded_forget(self: DFlashDrafter, row: object) -> None:
        if self.ready(row):
            left_from.append(len(self._rows))
        forget(self, row)

    monkeypatch.setattr(DFlashDrafter, "propose", recorded_propose)
    monkeypatch.setattr(DFlashDrafter, "_start", recorded_start)
    monkeypatch.setattr(DFlashDrafter, "forget", recorded_forget)
    base = _requests(engines["off"], 0.0)

    def longer(request: PreparedRequest, max_tokens: int) -> PreparedRequest:
        return dataclasses.replace(
            request, settings=dataclasses.replace(request.settings, max_tokens=max_tokens)
        )

    early = {"copy": longer(base["copy"], 400), "list": base["list"]}
    late = {"short": base["short"], "copy-late": dataclasses.replace(base["copy"], request_id="copy-late")}
    pacer = base["schema"]
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
        if name == "copy":
            assert report.finish_reason == pb.FINISH_REASON_CANCELLED
            assert 0 < len(report.token_ids) < len(expected[name])
            assert report.token_ids == expected[name][: len(report.token_ids)]
        else:
            assert report.token_ids == expected[name], name
    assert any(count >= 2 for count in asking), asking
    assert any(count >= 1 for count in joined_into), joined_into
    assert any(count >= 2 for count in left_from), left_from


@pytest.mark.slow
def test_seeded_sampling_through_dflash_keeps_the_target_distribution(
    engines: dict[str, Generator],
) -> None:
    """Over many seeds (different ones on each side), the third token's distribution with the
    DFlash drafter is the plain engine's (chi-square homogeneity)."""
    check_seeded_distribution(engines)


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
        for start in range(first_seed, first_seed + seeds, 40):
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


def _load_error(target: Path, drafter: Path) -> BaseException | None:
    config = EngineConfig(model=str(target), speculative="draft", draft_model=str(drafter), warmup=False)
    generator = Generator(config)
    generator.start(on_ready=lambda loaded, error: None)
    generator.join(120)  # a failed load ends the generation thread
    assert not generator.ready.is_set()
    return generator.load_error


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"num_target_layers": 3}, "target layer-count mismatch: draft=3, target=2"),
        ({"dflash_config": {"target_layer_ids": [0, 4]}}, "reads target layers [0, 4], the target has 2"),
        ({"dflash_config": {"mask_token_id": 10**6}}, "mask_token_id 1000000 is outside the vocabulary"),
    ],
)
def test_a_dflash_drafter_that_does_not_fit_the_target_fails_the_load_with_why(
    dflash: tuple[Path, Path], tmp_path: Path, change: dict[str, Any], why: str
) -> None:
    target, drafter = dflash
    broken = tmp_path / "drafter"
    shutil.copytree(drafter, broken)
    config = json.loads((broken / "config.json").read_text(encoding="utf-8"))
    for key, value in change.items():
        config[key] = {**config[key], **value} if isinstance(value, dict) else value
    (broken / "config.json").write_text(json.dumps(config), encoding="utf-8")
    error = _load_error(target, broken)
    assert isinstance(error, DraftModelError)
    assert why in str(error)
