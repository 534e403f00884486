"""DFlash drafter forwards batched across rows (issue 37.1, speculation/dflash_batch.py): one
drafter forward per step for every row that drafts, where mlx-vlm's drafter runs one per row, and
the same drafts — on the Qwen3.5 DFlash fixture (training/families/qwen3_5.py), its drafter
reading two target layers' hidden states.

- The forward itself: rows of different context lengths, cache depths and block sizes give, in
  one batched forward, the hidden states each row's own `_hidden` gives (float rounding), and
  leave each row's cache as its own forward leaves it.
- In the engine: 8 concurrent rows drafting with the batched drafter verify and accept exactly
  the drafts and take the tokens that one forward per row gives (and `--speculative off`), with
  one drafter forward per step where several rows draft (not one per row).
"""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.speculation.dflash_batch import batched_hidden, supports_batched
from vlmserve.engine.speculation.dflash_drafter import DFlashDrafter
from vlmserve.engine.speculation.model_drafter import load_model_drafter

from . import _drafter_scenarios as scenarios
from ._runs import run
from ._step_gate import verify_every_step
from .test_speculative_decoding import _generator, _requests

pytestmark = pytest.mark.needs_model


@pytest.fixture(autouse=True)
def verifying(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every step verifies with the prior widths and rates (as the drafter suite: two engines
    then draft alike whatever this machine's measured costs)."""
    verify_every_step(monkeypatch)


@pytest.fixture(scope="module")
def models(drafter_models: dict[str, tuple[Path, Path]]) -> tuple[Path, Path]:
    return drafter_models["qwen3_5_dflash"]


@pytest.fixture(scope="module")
def engines(models: tuple[Path, Path]) -> Iterator[dict[str, Generator]]:
    target, drafter = models
    settings = {"max_active": 16, "max_queue": 64}
    started = {
        "off": _generator("off", target, **settings),
        "batched": _generator("draft", target, draft_model=str(drafter), **settings),
        "per-row": _generator("draft", target, draft_model=str(drafter), **settings),
    }
    per_row = _drafter(started["per-row"])
    assert per_row._batched  # the fixture's drafter is one dflash_batch.py batches
    per_row._batched = False
    yield started
    for generator in started.values():
        generator.stop()


def _drafter(generator: Generator) -> DFlashDrafter:
    assert generator._runner is not None and generator._runner.batch.verifier is not None
    drafter = generator._runner.batch.verifier.model_drafter
    assert isinstance(drafter, DFlashDrafter)
    return drafter


def test_one_batched_forward_gives_each_rows_own_forward(models: tuple[Path, Path]) -> None:
    import mlx.core as mx
    from mlx_vlm.utils import load

    target, drafter = models
    model = load_model_drafter(str(drafter), load(str(target))[0])._model
    assert supports_batched(model)
    width = model.fc.weight.shape[1]
    rng = random.Random(7)
    mx.random.seed(7)
    # (context positions already in the cache, new context positions, block size) per row.
    shapes = [(0, 5, 4), (9, 1, 2), (3, 3, 5), (17, 2, 1)]
    own: list[list[Any]] = []
    shared: list[list[Any]] = []
    tokens, sizes, contexts = [], [], []
    for cached, fresh, size in shapes:
        caches = (model.make_cache(), model.make_cache())
        if cached:
            earlier = mx.random.normal((1, cached, width))
            for cache in caches:
                model._hidden(mx.array([[1]], dtype=mx.int32), earlier, cache)
        own.append(caches[0])
        shared.append(caches[1])
        tokens.append(rng.randrange(100))
        sizes.append(size)
        contexts.append(mx.random.normal((1, fresh, width)))
    mask_id = int(model.config.mask_token_id)
    alone = [
        model._hidden(mx.array([[token] + [mask_id] * (size - 1)], dtype=mx.int32), context, cache)
        for token, size, context, cache in zip(tokens, sizes, contexts, own, strict=True)
    ]
    together = batched_hidden(model, tokens, sizes, contexts, shared)
    for i, size in enumerate(sizes):
        assert mx.allclose(together[i : i + 1, :size], alone[i], atol=1e-5).item(), i
        for mine, theirs in zip(shared[i], own[i], strict=True):
            assert mine.offset == theirs.offset
            assert mx.allclose(mine.state[0], theirs.state[0], atol=1e-6).item(), i


def test_rows_draft_in_one_forward_what_a_forward_each_drafts(
    engines: dict[str, Generator], monkeypatch: pytest.MonkeyPatch
) -> None:
    steps: list[tuple[int, int]] = []  # (rows drafting, drafter forwards) per propose
    propose = DFlashDrafter.propose

    def counted(self: DFlashDrafter, rows: Any, counts: Any) -> list[list[int]]:
        drafting = sum(1 for row in rows if self._rows[row.key].pending)
        before = self.forwards
        drafts = propose(self, rows, counts)
        steps.append((drafting, self.forwards - before))
        return drafts

    monkeypatch.setattr(DFlashDrafter, "propose", counted)
    requests = scenarios.with_max_tokens(_requests(engines["off"], 0.0), (7, 13, 40))
    expected = {n: report.token_ids for n, report in run(engines["off"], requests, "off").items()}
    results = {}
    for name in ("batched", "per-row"):
        generator = engines[name]
        steps.clear()
        before = list(scenarios.draft_counts(generator).values())
        reports = run(generator, requests, name)
        after = list(scenarios.draft_counts(generator).values())
        results[name] = (
            [b - a for a, b in zip(before, after, strict=True)],
            {n: report.token_ids for n, report in reports.items()},
        )
        assert results[name][1] == expected, name
        several = [(rows, forwards) for rows, forwards in steps if rows > 1]
        assert several, steps
        if name == "batched":
            assert all(forwards == 1 for _, forwards in several), several
        else:
            assert all(forwards == rows for rows, forwards in several), several
    assert results["batched"] == results["per-row"]  # the same drafts verified and accepted
    assert results["batched"][0][1] > 0  # some were accepted
