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

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.speculation.dflash_drafter import DFlashDrafter

from . import _drafter_scenarios as scenarios

pytestmark = pytest.mark.needs_model

MODES = ("draft", "auto")


@pytest.fixture(scope="module")
def dflash(drafter_models: dict[str, tuple[Path, Path]]) -> tuple[Path, Path]:
    return drafter_models["qwen3_5_dflash"]


@pytest.fixture(scope="module")
def engines(dflash: tuple[Path, Path]) -> Iterator[dict[str, Generator]]:
    yield from scenarios.started_engines(*dflash, MODES)


def _context_positions(drafter: DFlashDrafter, row: Any) -> int:
    """Positions a row's drafter has been fed or holds to feed."""
    state = drafter._rows[row.key]
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
    before = {mode: scenarios.draft_counts(engines[mode]) for mode in MODES}
    batch = scenarios.MixedBatch.on(engines["off"], temperature)
    for mode in MODES:
        generator = engines[mode]
        contexts.clear()
        alone = batch.alone(generator)
        # A row that ran its prompt alone: its drafter's context is its prompt and every token
        # the target has taken since but the latest (the next block starts with it), no more:
        # rejected drafts never reach it, whoever drafted them (lookup too: auto).
        assert contexts, mode
        assert all(fed == prompt + drawn - 1 for prompt, drawn, fed in contexts), (mode, contexts)
        contexts.clear()
        together = batch.together(generator)
        # In a batch, a prompt run in a shared forward starts its drafter at its first token.
        assert all(fed in (prompt + drawn - 1, drawn - 1) for prompt, drawn, fed in contexts), (
            mode,
            contexts,
        )
        batch.check_tokens(generator, alone, together, mode)
        for name in batch.requests:
            assert alone[name].result.usage == batch.expected[name].result.usage, (mode, name)
        batch.check_logprobs(together, mode)
        json.loads(together["schema"].result.text)  # the constrained row still validates
    drafted, accepted = scenarios.drafted_since(engines["draft"], before["draft"])
    assert drafted > 0
    if temperature == 0.0:  # the fixture's greedy loops: drafts accepted and rejected
        assert 0 < accepted < drafted, (accepted, drafted)
    assert scenarios.count(engines["draft"], "drafted_tokens", "lookup") == 0
    assert scenarios.count(engines["auto"], "drafted_tokens", "lookup") > 0


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_dflash_rows_leaving_mid_verify_change_no_other_row(
    engines: dict[str, Generator], monkeypatch: pytest.MonkeyPatch, temperature: float
) -> None:
    """Rows with different max tokens end at different steps, while the next verify forward is in
    flight (the recurrent layers drop them at that verify's commit); every row still takes its
    plain tokens."""
    commits = scenarios.record_commits(monkeypatch)
    scenarios.check_rows_leaving_mid_verify(engines, temperature)
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
    scenarios.check_join_and_cancel_while_drafting(engines["off"], engines["draft"])
    assert any(count >= 2 for count in asking), asking
    assert any(count >= 1 for count in joined_into), joined_into
    assert any(count >= 2 for count in left_from), left_from


@pytest.mark.slow
def test_seeded_sampling_through_dflash_keeps_the_target_distribution(
    engines: dict[str, Generator],
) -> None:
    """Over many seeds (different ones on each side), the third token's distribution with the
    DFlash drafter is the plain engine's (chi-square homogeneity)."""
    scenarios.check_seeded_distribution(engines)


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
    def edit(config: dict[str, Any]) -> None:
        for key, value in change.items():
            config[key] = {**config[key], **value} if isinstance(value, dict) else value

    scenarios.check_load_fails(*dflash, tmp_path, edit, why)
