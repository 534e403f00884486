"""Quantized KV caches (`--kv-bits 8|4`, uniform or turboquant): mlx-vlm's quantized caches
through every path of the loop — a request alone, in a mixed batch with joins and a cancel,
prompts prefilled together, prefixes shared in flight, the prefix cache and its disk tier — and
what they save.

Within one precision the engine keeps its promise (each request gives what it gives alone); the
quantized run is compared with the full-precision one by its KV bytes and its logits, and the
first token where greedy output departs is reported by bench/kv_quantization.py."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests._fixture_models import RANDOM_MODEL_PATH
from vlmserve.engine.cli import EngineCommand
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.jobs import PreparedRequest
from vlmserve.engine.kv.layout import KVLayout, layout_for
from vlmserve.engine.kv.merge import merge_rows
from vlmserve.engine.kv.sizing import bytes_per_token
from vlmserve.engine.loop.generator import Generator
from vlmserve.server.settings import SettingsError

from ._runs import run
from .test_batching import (
    alone,
    assert_equal_to_alone,
    check_mixed_equals_alone,
    prepared,
    recorded,
    submitted_in_one_step,
)
from .test_engine_grpc import text_part
from .test_shared_prefix import arriving_together

# A batch's forward rounds a little differently from a single row's (1e-6 here); quantizing its
# keys can move a value to the next quantization step, so logits agree to 1e-3, not 1e-4. Tokens
# stay identical.
QUANTIZED_ATOL = 1e-3
# 4-bit turboquant has 16 codebook levels per value: the neighbour step is further away, so a
# moved value shows more (seen: 1.1e-3 on one step of 64). Tokens stay identical.
TURBO_4_ATOL = 3e-3


def quantized_generator(bits: int, **overrides: object) -> Generator:
    settings: dict[str, object] = {
        "max_active": 8,
        "max_queue": 16,
        "max_output_tokens": 64,
        "prefill_chunk_tokens": 32,
        "step_tokens": 48,
        "prefix_cache_min_tokens": 0,
        "warmup": False,
        "kv_bits": bits,
        **overrides,
    }
    generator = Generator(EngineConfig(model=str(RANDOM_MODEL_PATH), **settings))  # type: ignore[arg-type]
    generator.start()
    assert generator.ready.wait(60), generator.load_error
    return generator


TURBO = {"kv_quant_scheme": "turboquant"}


@pytest.fixture(
    scope="module",
    params=[(8, {}), (4, {}), (4, TURBO)],
    ids=["8-bit", "4-bit", "turboquant-4-bit"],
)
def quantized(request: pytest.FixtureRequest) -> Iterator[Generator]:
    bits, scheme = request.param
    generator = quantized_generator(bits, **scheme)
    yield generator
    generator.stop()


LAYOUT_CASES = [
    ("off", None, 64, 128, KVLayout()),
    ("8-bit, groups of 64", 8, 64, 128, KVLayout(8, 64)),
    ("small heads take groups of 32", 4, 64, 32, KVLayout(4, 32)),
    ("a group size that does not divide", 8, 128, 96, KVLayout(8, 32)),
    ("turboquant has no groups: any head width", 4, 64, 16, KVLayout(4, 64, "turboquant")),
    ("turboquant off", None, 64, 16, KVLayout()),
]


@pytest.mark.parametrize(
    ("name", "bits", "group", "head_dim", "expected"), LAYOUT_CASES, ids=[c[0] for c in LAYOUT_CASES]
)
def test_layout_for(name: str, bits: int | None, group: int, head_dim: int, expected: KVLayout) -> None:
    scheme = "turboquant" if name.startswith("turboquant") else "uniform"
    assert layout_for(bits, group, head_dim, scheme) == expected


@pytest.mark.parametrize(
    ("environ", "named"),
    [
        ({"VLMSERVE_ENGINE_KV_BITS": "3"}, r"\$VLMSERVE_ENGINE_KV_BITS: Input should be 4 or 8"),
        ({"VLMSERVE_ENGINE_KV_BITS": "eight"}, r"\$VLMSERVE_ENGINE_KV_BITS"),
        ({"VLMSERVE_ENGINE_KV_QUANT_SCHEME": "fp8"}, r"\$VLMSERVE_ENGINE_KV_QUANT_SCHEME: Input should be"),
    ],
)
def test_a_kv_setting_outside_its_choices_stops_start_up(environ: dict[str, str], named: str) -> None:
    with pytest.raises(SettingsError, match=named):
        EngineCommand.from_env(environ)


def test_the_kv_settings_read_from_text() -> None:
    engine = EngineCommand.from_env(
        {"VLMSERVE_ENGINE_KV_BITS": "8", "VLMSERVE_ENGINE_KV_QUANT_SCHEME": "turboquant"}
    ).engine
    assert (engine.kv_bits, engine.kv_quant_scheme) == (8, "turboquant")
    assert EngineCommand.from_env({"VLMSERVE_ENGINE_KV_BITS": "none"}).engine.kv_bits is None


def test_a_head_dimension_no_group_divides_is_refused() -> None:
    with pytest.raises(ValueError, match="divisible by 32"):
        layout_for(8, 64, 48)


def _uniform_row() -> object:
    from mlx_vlm.models.cache import QuantizedKVCache

    return QuantizedKVCache(group_size=32, bits=8)


def _turbo_row() -> object:
    from mlx_vlm.turboquant import TurboQuantKVCache

    return TurboQuantKVCache(bits=4)


@pytest.mark.parametrize("new_row", [_uniform_row, _turbo_row], ids=["uniform", "turboquant"])
def test_merged_rows_give_each_row_back(new_row: Any) -> None:
    """`merge_rows` (ours: mlx-vlm has the one-row merge only for full precision)."""
    import mlx.core as mx

    rows = []
    for length in (5, 9, 0):
        cache = new_row()
        if length:
            keys = mx.random.normal((1, 2, length, 32), key=mx.random.key(length))
            cache.update_and_fetch(keys, keys * 2)
        rows.append(cache)
    batch = merge_rows(rows)
    assert [int(x) for x in np.asarray(batch.left_padding)] == [4, 0, 9]
    assert [int(x) for x in np.asarray(batch.offset)] == [5, 9, 0]
    for index, row in enumerate(rows[:2]):
        back = batch.extract(index)
        assert back.offset == row.offset
        assert type(back.keys) is type(row.keys)  # turboquant's attention dispatches on its state type
        for mine, theirs in zip(back.keys, row.keys, strict=True):
            np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs[:, :, : row.offset]))


def test_a_turboquant_group_prefill_rolls_padding_left() -> None:
    """`prepare(right_padding)` / `finalize` (ours: mlx-vlm's batch turboquant cache lacks them):
    each row's real positions end up last, as if it had been left-padded."""
    import mlx.core as mx
    from mlx_vlm.turboquant import TurboQuantKVCache

    batch = merge_rows([TurboQuantKVCache(bits=4), TurboQuantKVCache(bits=4)])
    keys = mx.random.normal((2, 2, 6, 32), key=mx.random.key(3))
    batch.prepare(right_padding=[2, 0])
    batch.update_and_fetch(keys, keys)
    batch.finalize()
    assert [int(x) for x in np.asarray(batch.left_padding)] == [2, 0]
    assert [int(x) for x in np.asarray(batch.offset)] == [4, 6]
    alone = TurboQuantKVCache(bits=4)
    alone.update_and_fetch(keys[:1, :, :4], keys[:1, :, :4])
    back = batch.extract(0)
    for mine, theirs in zip(back.keys, alone.state[0], strict=True):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs))


@pytest.mark.parametrize("temperature", [0.0, 1.5])
def test_a_mixed_batch_equals_each_request_alone(quantized: Generator, temperature: float) -> None:
    assert quantized.loaded is not None and quantized.loaded.kv_layout.quantized
    check_mixed_equals_alone(quantized, temperature, atol=QUANTIZED_ATOL)


@pytest.mark.parametrize(("bits", "scheme"), [(8, {}), (4, TURBO)], ids=["8-bit", "turboquant-4-bit"])
@pytest.mark.needs_model
def test_prompts_shared_in_flight_equal_each_alone(bits: int, scheme: dict[str, str]) -> None:
    generator = quantized_generator(
        bits, prefill_chunk_tokens=128, step_tokens=512, shared_prefix_min_tokens=8, **scheme
    )
    try:
        requests, alone_logits = recorded(arriving_together(generator, 0.0))
        reference = alone(generator, requests, "q-shared")
        requests, together_logits = recorded(arriving_together(generator, 0.0))
        together = submitted_in_one_step(generator, requests, "q-shared")
        assert together["follower"].cached_tokens > 30
        atol = TURBO_4_ATOL if scheme else QUANTIZED_ATOL
        assert_equal_to_alone(together, reference, together_logits, alone_logits, atol=atol)
    finally:
        generator.stop()


@pytest.mark.parametrize(
    ("scheme", "parts"),
    [({}, 3), (TURBO, 2)],
    ids=["uniform (data, scales, biases)", "turboquant (norms, indices)"],
)
@pytest.mark.needs_model
def test_a_cached_prefix_is_quantized_and_reused_with_identical_output(
    tmp_path: Path, scheme: dict[str, str], parts: int
) -> None:
    system = " ".join(f"Rule {i}: be brief." for i in range(20))

    def ask(generator: Generator, question: str) -> dict[str, PreparedRequest]:
        return {"r": prepared(generator, text_part(f"{system} {question}"), temperature=0.0, seed=1)}

    generator = quantized_generator(4, prefix_cache_min_tokens=16, prefix_cache_dir=str(tmp_path), **scheme)
    try:
        cold = run(generator, ask(generator, "Question two?"), "q-cold")["r"]
        assert generator.prefix_cache is not None
        generator.prefix_cache.clear()  # the cold run was kept too
        run(generator, ask(generator, "Question one?"), "q-first")
        (entry,) = generator.prefix_cache._entries.values()
        keys, _values = entry.layers[0]
        assert isinstance(keys, tuple) and len(keys) == parts
        warm = run(generator, ask(generator, "Question two?"), "q-warm")["r"]
        assert warm.cached_tokens > 16
        assert warm.token_ids == cold.token_ids
        generator.prefix_cache.clear()
        run(generator, ask(generator, "Question one?"), "q-first-again")
    finally:
        generator.stop()  # writes the cache to the disk tier
    assert list(tmp_path.rglob("*.safetensors"))
    restarted = quantized_generator(4, prefix_cache_min_tokens=16, prefix_cache_dir=str(tmp_path), **scheme)
    try:
        from_disk = run(restarted, ask(restarted, "Question two?"), "q-disk")["r"]
        assert restarted.prefix_cache is not None and restarted.prefix_cache.hits["disk"] == 1
        assert from_disk.cached_tokens == warm.cached_tokens
        assert from_disk.token_ids == cold.token_ids
    finally:
        restarted.stop()
    # Another precision or scheme never reads these entries (its own namespace).
    other = quantized_generator(
        4 if scheme else 8, prefix_cache_min_tokens=16, prefix_cache_dir=str(tmp_path)
    )
    try:
        assert run(other, ask(other, "Question two?"), "q-other")["r"].cached_tokens == 0
    finally:
        other.stop()


@pytest.mark.needs_model
def test_quantized_kv_takes_the_bytes_it_should() -> None:
    """An entry's bytes per token, measured from the arrays, against full precision."""
    full = Generator(EngineConfig(model=str(RANDOM_MODEL_PATH), warmup=False, prefix_cache_min_tokens=4))
    generators = {
        "full": full,
        8: quantized_generator(8, prefix_cache_min_tokens=4),
        4: quantized_generator(4, prefix_cache_min_tokens=4),
        "turbo 4": quantized_generator(4, prefix_cache_min_tokens=4, **TURBO),
        "turbo 8": quantized_generator(8, prefix_cache_min_tokens=4, **TURBO),
    }
    full.start()
    assert full.ready.wait(60)
    try:
        measured = {}
        for name, generator in generators.items():
            request = {
                "r": prepared(
                    generator, text_part("Count the boxes on every shelf."), temperature=0.0, seed=1
                )
            }
            report = run(generator, request, f"bytes-{name}")["r"]
            assert generator.prefix_cache is not None
            (entry,) = generator.prefix_cache._entries.values()
            measured[name] = entry.nbytes / entry.token_ids.size
            assert generator.loaded is not None
            expected = bytes_per_token(generator.loaded.model.language_model, generator.loaded.kv_layout, 4)
            assert measured[name] == expected, name
            assert report.output_tokens > 0
        # head dim 32 (groups of 32), float32 scales on the CPU: 8-bit (32 + 8) / 128, 4-bit (16 + 8) / 128
        assert measured[8] / measured["full"] == pytest.approx(40 / 128)
        assert measured[4] / measured["full"] == pytest.approx(24 / 128)
        # turboquant: 32 values in 4 (8) 32-bit words + a float16 norm per vector
        assert measured["turbo 4"] / measured["full"] == pytest.approx(18 / 128)
        assert measured["turbo 8"] / measured["full"] == pytest.approx(34 / 128)
    finally:
        for generator in generators.values():
            generator.stop()
