"""mlx-vlm's EAGLE-3 drafters (`--draft-model` on an `eagle3` checkpoint) in the batched engine are
lossless: on a 4-layer Qwen3.5 fixture with an EAGLE-3 drafter reading three target layers'
hidden states (training/families/qwen3_5.py `build_eagle3_drafter`), every request generates
exactly the tokens and usage it generates with `--speculative off`, greedy and seeded, alone and
in a mixed batch, rows leaving mid-verify; its rows share one batched drafter state
(model_drafter.py) that drafts exactly what one state per row drafts; a drafter reading layers
the target cannot give fails the load with why.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.speculation.model_drafter import DraftModelError, ModelDrafter

from .test_speculative_decoding import _generator, _requests
from .test_speculative_dflash import _load_error, check_seeded_distribution
from .test_speculative_drafter import _count, _logprobs, _run, _tokens

pytestmark = pytest.mark.needs_model


@pytest.fixture(scope="module")
def eagle3(drafter_models: dict[str, tuple[Path, Path]]) -> tuple[Path, Path]:
    return drafter_models["qwen3_5_eagle3"]


@pytest.fixture(scope="module")
def engines(eagle3: tuple[Path, Path]) -> Iterator[dict[str, Generator]]:
    target, drafter = eagle3
    generators = {
        mode: _generator(
            mode, target, max_active=16, max_queue=64, draft_model=str(drafter) if mode != "off" else None
        )
        for mode in ("off", "draft", "auto")
    }
    yield generators
    for generator in generators.values():
        generator.stop()


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_eagle3_rows_take_the_tokens_they_take_without_speculation(
    engines: dict[str, Generator], temperature: float
) -> None:
    plain = engines["off"]
    requests = _requests(plain, temperature)
    drafted_before = _count(engines["draft"], "drafted_tokens", "draft")
    accepted_before = _count(engines["draft"], "accepted_tokens", "draft")
    expected = {
        name: _run(plain, {name: request}, f"alone-{temperature}")[name] for name, request in requests.items()
    }
    for mode in ("draft", "auto"):
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
        got, want_logprobs = _logprobs(together["logprobs"].result), _logprobs(expected["logprobs"].result)
        assert [entry[0] for entry in got] == [entry[0] for entry in want_logprobs], mode
        json.loads(together["schema"].result.text)
    assert generator._runner is not None
    drafter = generator._runner.batch.speculator.model_drafter  # type: ignore[union-attr]
    assert isinstance(drafter, ModelDrafter) and drafter.kind == "eagle3" and drafter._shared
    assert drafter.capture_layer_ids == (1, 2, 3)
    drafted = _count(engines["draft"], "drafted_tokens", "draft") - drafted_before
    accepted = _count(engines["draft"], "accepted_tokens", "draft") - accepted_before
    assert drafted > 0
    if temperature == 0.0:  # the fixture's greedy loops: drafts accepted and rejected
        assert 0 < accepted < drafted, (accepted, drafted)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_eagle3_rows_leaving_mid_verify_change_no_other_row(
    engines: dict[str, Generator], temperature: float
) -> None:
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


def test_eagle3_rows_batched_draft_what_a_state_per_row_drafts(
    engines: dict[str, Generator], eagle3: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The shared drafter batch (rows joining and leaving, ragged accepts) proposes the drafts one
    drafter state per row proposes: the same drafts verified and accepted, the same tokens."""
    held: list[int] = []  # rows in the drafter's largest state, per propose
    propose = ModelDrafter.propose

    def recorded(self: ModelDrafter, rows: Any, counts: Any) -> list[list[int]]:
        held.append(max((len(batch.order) for batch in self._batches), default=0))
        return propose(self, rows, counts)

    monkeypatch.setattr(ModelDrafter, "propose", recorded)
    target, drafter = eagle3
    base = _requests(engines["off"], 0.0)
    requests = {
        f"{name}-{limit}": dataclasses.replace(
            request, settings=dataclasses.replace(request.settings, max_tokens=limit)
        )
        for name, request in base.items()
        for limit in (7, 13, 40)
    }
    per_row = _generator("draft", target, max_active=16, max_queue=64, draft_model=str(drafter))
    try:
        assert per_row._runner is not None and per_row._runner.batch.speculator is not None
        alone = per_row._runner.batch.speculator.model_drafter
        assert isinstance(alone, ModelDrafter)
        alone._shared = False
        counts = {}
        for name, generator in (("shared", engines["draft"]), ("per-row", per_row)):
            before = [_count(generator, metric, "draft") for metric in ("drafted_tokens", "accepted_tokens")]
            jobs = _run(generator, requests, f"batched-{name}")
            after = [_count(generator, metric, "draft") for metric in ("drafted_tokens", "accepted_tokens")]
            counts[name] = (
                [b - a for a, b in zip(before, after, strict=True)],
                {n: _tokens(generator, job) for n, job in jobs.items()},
            )
            if name == "shared":
                assert max(held) >= 2, held
    finally:
        per_row.stop()
    assert counts["shared"] == counts["per-row"]
    assert counts["shared"][0][1] > 0


@pytest.mark.slow
def test_seeded_sampling_through_eagle3_keeps_the_target_distribution(engines: dict[str, Generator]) -> None:
    check_seeded_distribution(engines)


@pytest.mark.parametrize(
    ("change", "why"),
    [
        ({"eagle_aux_hidden_state_layer_ids": [2, 3, 9]}, "reads target layers [1, 2, 8], the target has 4"),
        ({"eagle_aux_hidden_state_layer_ids": [3, 3, 4]}, "its capture_layer_ids [2, 2, 3] give 2"),
    ],
)
def test_an_eagle3_drafter_that_does_not_fit_the_target_fails_the_load_with_why(
    eagle3: tuple[Path, Path], tmp_path: Path, change: dict[str, Any], why: str
) -> None:
    target, drafter = eagle3
    broken = tmp_path / "drafter"
    shutil.copytree(drafter, broken)
    config = json.loads((broken / "config.json").read_text(encoding="utf-8"))
    config.update(change)
    (broken / "config.json").write_text(json.dumps(config), encoding="utf-8")
    error = _load_error(target, broken)
    assert isinstance(error, DraftModelError)
    assert why in str(error)
