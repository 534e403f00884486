"""The engine's warm-up runs what a first real turn runs (loop/warm_up.py): a whole prefill chunk
at the configured width through every layer, then a chunk at an offset, and an agent's next turn
that starts from the prefix cache (for the hybrid qwen3_5 fixture, its recurrent-state snapshot),
with a decode step through the speculative verifier, bounded by the context; nothing stays in
the caches. Real mlx-vlm on the fixtures; the chunk
widths are read by wrapping the prefill function, which still runs."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests._fixture_models import RANDOM_MODEL_PATH
from training.families import DRAFTER_FAMILIES, build_family
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.loop.prefill import prefill_chunk
from vlmserve.engine.loop.verifier import Verifier
from vlmserve.engine.loop.warm_up import MAX_PROMPT_TOKENS, WarmUpReport, warm_up
from vlmserve.engine.loop.wiring import build_parts, model_lifecycle
from vlmserve.engine.metrics import EngineMetrics

pytestmark = [pytest.mark.needs_model]


@pytest.fixture(scope="module")
def hybrid_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_family(DRAFTER_FAMILIES["qwen3_5"], tmp_path_factory.mktemp("warm-up") / "qwen3_5")


@pytest.fixture
def chunks(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[int, int]]]:
    """(start, end) of every prefill chunk run."""
    seen: list[tuple[int, int]] = []

    def recording(model: Any, inputs: Any, cache: Any, start: int, end: int, **kwargs: Any) -> Any:
        seen.append((start, end))
        return prefill_chunk(model, inputs, cache, start, end, **kwargs)

    monkeypatch.setattr("vlmserve.engine.loop.prompt_batch.prefill_chunk", recording)
    yield seen


def warmed(model: Path, chunk: int, **settings: Any) -> tuple[WarmUpReport, Any]:
    config = EngineConfig(model=str(model), prefill_chunk_tokens=chunk, **settings)
    metrics = EngineMetrics()
    loaded = model_lifecycle(config, metrics, drop_caches=lambda: None).open()
    parts = build_parts(config, loaded, metrics)
    return warm_up(loaded, parts, chunk_tokens=chunk), parts


@pytest.mark.parametrize("family", ["random", "qwen3_5"])
def test_warm_up_runs_a_whole_chunk_and_a_restored_next_turn(
    family: str, hybrid_model: Path, chunks: list[tuple[int, int]], monkeypatch: pytest.MonkeyPatch
) -> None:
    model = RANDOM_MODEL_PATH if family == "random" else hybrid_model
    verify_steps: list[int] = []
    real_launch = Verifier.launch

    def launch(self: Verifier[Any], *args: Any, **kwargs: Any) -> Any:
        verify_steps.append(1)
        return real_launch(self, *args, **kwargs)

    monkeypatch.setattr(Verifier, "launch", launch)
    report, parts = warmed(model, 64)  # speculation: "auto" (the default)
    assert verify_steps, "no decode step went through the speculative verifier"
    assert [r.finish_reason for r in report.runs] == [report.runs[0].finish_reason] * 3
    assert all(r.output_tokens > 0 for r in report.runs)
    # A chunk of the configured width, and one after it at an offset.
    assert (0, 64) in chunks
    assert any(start >= 64 for start, _ in chunks)
    # The next turn took the long prompt from the prefix cache and prefilled only its tail.
    long_prompt = report.runs[1].prompt_tokens
    assert long_prompt > 64
    assert report.restored_tokens == long_prompt
    assert chunks[-1][0] == long_prompt
    # Nothing stays behind, not even in the hit counts that metrics report.
    assert len(parts.prefix_cache) == 0
    assert parts.prefix_cache.hits == {"memory": 0, "disk": 0}


def test_warm_up_without_a_prefix_cache_prefills_the_next_turn(chunks: list[tuple[int, int]]) -> None:
    report, _ = warmed(RANDOM_MODEL_PATH, 64, prefix_cache_min_tokens=0)
    assert report.restored_tokens == 0
    assert (0, 64) in chunks


def test_warm_up_prompt_is_bounded(chunks: list[tuple[int, int]]) -> None:
    report, parts = warmed(RANDOM_MODEL_PATH, 100_000)
    bound = min(parts.loaded.info.context_length // 2, MAX_PROMPT_TOKENS)
    # The measured words per token overshoot the target by a few words at most.
    assert bound <= max(run.prompt_tokens for run in report.runs) <= bound + 64
