"""mlx-vlm's EAGLE-3 drafters (`--draft-model` on an `eagle3` checkpoint) in the batched engine are
lossless: on a 4-layer Qwen3.5 fixture with an EAGLE-3 drafter reading three target layers'
hidden states (training/families/qwen3_5.py `build_eagle3_drafter`), every request generates
exactly the tokens and usage it generates with `--speculative off`, greedy and seeded, alone and
in a mixed batch, rows leaving mid-verify; its rows share one batched drafter state
(model_drafter.py) that drafts exactly what one state per row drafts; a drafter reading layers
the target cannot give fails the load with why.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.speculation.model_drafter import ModelDrafter

from . import _drafter_scenarios as scenarios
from .test_speculative_decoding import _generator, _requests

pytestmark = pytest.mark.needs_model


@pytest.fixture(scope="module")
def eagle3(drafter_models: dict[str, tuple[Path, Path]]) -> tuple[Path, Path]:
    return drafter_models["qwen3_5_eagle3"]


@pytest.fixture(scope="module")
def engines(eagle3: tuple[Path, Path]) -> Iterator[dict[str, Generator]]:
    yield from scenarios.started_engines(*eagle3, ("draft", "auto"))


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_eagle3_rows_take_the_tokens_they_take_without_speculation(
    engines: dict[str, Generator], temperature: float
) -> None:
    before = scenarios.draft_counts(engines["draft"])
    batch = scenarios.MixedBatch.on(engines["off"], temperature)
    for mode in ("draft", "auto"):
        generator = engines[mode]
        alone = batch.alone(generator)
        together = batch.together(generator)
        batch.check_tokens(generator, alone, together, mode)
        got, want_logprobs = (
            scenarios.logprobs(together["logprobs"].result),
            scenarios.logprobs(batch.expected["logprobs"].result),
        )
        assert [entry[0] for entry in got] == [entry[0] for entry in want_logprobs], mode
        json.loads(together["schema"].result.text)
    assert generator._runner is not None
    drafter = generator._runner.batch.verifier.model_drafter  # type: ignore[union-attr]
    assert isinstance(drafter, ModelDrafter) and drafter.kind == "eagle3" and drafter._shared
    assert drafter.capture_layer_ids == (1, 2, 3)
    drafted, accepted = scenarios.drafted_since(engines["draft"], before)
    assert drafted > 0
    if temperature == 0.0:  # the fixture's greedy loops: drafts accepted and rejected
        assert 0 < accepted < drafted, (accepted, drafted)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_eagle3_rows_leaving_mid_verify_change_no_other_row(
    engines: dict[str, Generator], temperature: float
) -> None:
    scenarios.check_rows_leaving_mid_verify(engines, temperature)


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
            jobs = scenarios.run(generator, requests, f"batched-{name}")
            after = list(scenarios.draft_counts(generator).values())
            counts[name] = (
                [b - a for a, b in zip(before, after, strict=True)],
                {n: scenarios.tokens(generator, job) for n, job in jobs.items()},
            )
            if name == "shared":
                assert max(held) >= 2, held
    finally:
        per_row.stop()
    assert counts["shared"] == counts["per-row"]
    assert counts["shared"][0][1] > 0


@pytest.mark.slow
def test_seeded_sampling_through_eagle3_keeps_the_target_distribution(engines: dict[str, Generator]) -> None:
    scenarios.check_seeded_distribution(engines)


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
    scenarios.check_load_fails(*eagle3, tmp_path, lambda config: config.update(change), why)
