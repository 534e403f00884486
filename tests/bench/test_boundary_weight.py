"""bench/boundary_weight.py: an entry's weight from a published config, against the arithmetic
written out by hand for each kind of layer."""

from __future__ import annotations

import pytest

from bench.boundary_weight import CONFIGS, MIB, Weight, weight


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        # 30 Gated DeltaNet layers: a conv window of 3 x (2 x 16 x 128 + 32 x 128) channels and a
        # 32 x 128 x 128 state, float32; 10 full layers of 2 KV heads x 256, bfloat16.
        ("Qwen3.6-35B-A3B", Weight(30 * (3 * 8192 + 32 * 128 * 128) * 4, 10 * 2 * 256 * 2 * 2, 30, 10)),
        # 52 local layers' 1,024-position window of 16 KV heads x 128; 10 global layers.
        ("Gemma 3 27B", Weight(52 * 1024 * 16 * 128 * 2 * 2, 10 * 16 * 128 * 2 * 2, 52, 10)),
        # 25 local layers of 8 KV heads x 256; 5 global layers of 2 KV heads x 512.
        ("Gemma 4 26B-A4B", Weight(25 * 8 * MIB, 5 * 2 * 512 * 2 * 2, 25, 5)),
        ("Gemma 4 31B", Weight(50 * 16 * MIB, 10 * 4 * 512 * 2 * 2, 50, 10)),
    ],
)
def test_an_entry_weighs_its_layers_states_and_kv(name: str, expected: Weight) -> None:
    assert weight(CONFIGS[name]) == expected


def test_a_window_bounds_a_boundary_whatever_the_context() -> None:
    longer = {**CONFIGS["Gemma 4 26B-A4B"], "max_position_embeddings": 262_144}
    assert weight(longer).boundary_bytes == 200 * MIB
    assert weight({**longer, "sliding_window": 512}).boundary_bytes == 100 * MIB
