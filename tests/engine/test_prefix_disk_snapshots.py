"""Boundary states on disk (issue 33): the layers no prefix can be cut from — a recurrent
`ArraysCache`, a sliding-window `RotatingKVCache` — written with their entry and read back into a
fresh cache of the model, exactly; a state that does not fit the model is refused and its file
removed, never served. mlx-vlm's own cache classes on small arrays (no model); the restart on
the real family fixtures is test_family_restart.py."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
import pytest
from mlx_vlm.models.cache import ArraysCache, KVCache, RotatingKVCache

from vlmserve.engine.kv.snapshot_codec import state_arrays, state_from_arrays
from vlmserve.engine.kv.snapshots import boundary_state
from vlmserve.engine.loop.prefix_cache import PrefixCache
from vlmserve.engine.loop.prefix_disk import PrefixDiskTier

NAMESPACE = "family#snapshots"
TOKENS = 10


def templates() -> list[Any]:
    """A fresh cache of the "model": plain, sliding-window (window 4) and recurrent layers."""
    return [KVCache(), RotatingKVCache(max_size=4), ArraysCache(2)]


def filled(tokens: int, seed: int = 0) -> list[Any]:
    """A one-row cache after `tokens` positions: bfloat16 keys, float32 recurrent states."""
    rng = np.random.default_rng(seed)

    def random(*shape: int) -> mx.array:
        return mx.array(rng.standard_normal(shape).astype(np.float32))

    cache = templates()
    cache[0].update_and_fetch(random(1, 1, tokens, 2).astype(mx.bfloat16), random(1, 1, tokens, 2))
    cache[1].update_and_fetch(random(1, 1, tokens, 2).astype(mx.bfloat16), random(1, 1, tokens, 2))
    cache[2].cache = [random(1, 3, 4), random(1, 2, 4, 4)]
    cache[2].note_added_by_the_model = 7  # a plain value a live layer may carry
    return cache


def same_state(restored: list[Any], expected: list[Any]) -> bool:
    for got, want in zip(restored, expected, strict=True):
        if (got is None) != (want is None):
            return False
        if got is None:
            continue
        assert type(got) is type(want)
        for name, value in vars(want).items():
            other = getattr(got, name)
            if isinstance(value, mx.array):
                if other.dtype != value.dtype or not mx.array_equal(other, value).item():
                    return False
            elif isinstance(value, list | tuple):
                if type(other) is not type(value) or len(other) != len(value):
                    return False
                for a, b in zip(other, value, strict=True):
                    if (a is None) != (b is None) or (b is not None and not mx.array_equal(a, b).item()):
                        return False
            elif other != value:
                return False
    return True


def test_a_state_round_trips_into_a_fresh_cache() -> None:
    state = boundary_state(filled(TOKENS))
    assert state is not None and state[0] is None  # the plain layer is cut instead
    arrays, layout = state_arrays(state)
    restored = state_from_arrays(layout, arrays, templates())
    assert same_state(restored, state)
    assert restored[2] is not state[2]  # a copy: a later update never writes into the kept state


def refused(change: Any) -> None:
    state = boundary_state(filled(TOKENS))
    assert state is not None
    arrays, layout = state_arrays(state)
    change(arrays, layout)
    with pytest.raises(ValueError):
        state_from_arrays(layout, arrays, templates())


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(lambda a, d: d["1"].update(type="ChunkedKVCache"), id="another class"),
        pytest.param(lambda a, d: d["1"]["values"].pop("offset"), id="an attribute missing"),
        pytest.param(lambda a, d: a.pop("2.cache.1"), id="an array missing"),
        pytest.param(lambda a, d: a.update({"1.extra": mx.zeros(1)}), id="an array no layer names"),
        pytest.param(lambda a, d: d.update({"5": d["1"]}), id="a layer the model lacks"),
        pytest.param(lambda a, d: d.pop("1"), id="a windowed layer without its state"),
        pytest.param(lambda a, d: d["1"]["values"].update(update_and_fetch=1), id="shadows a method"),
        pytest.param(lambda a, d: d["1"]["values"].update(offset=[1, 2]), id="not a plain value"),
        pytest.param(lambda a, d: d["2"]["sequences"]["cache"].update(kind="dict"), id="not a sequence"),
    ],
)
def test_a_state_that_does_not_fit_the_model_is_refused(change: Any) -> None:
    refused(change)


def kept(folder: Path, *, layers: Any = templates) -> PrefixCache:
    disk = PrefixDiskTier(folder, namespace=NAMESPACE, max_bytes=1 << 24)
    return PrefixCache(min_tokens=4, max_bytes=1 << 24, disk=disk, new_cache=layers)


def test_an_entry_with_boundary_states_survives_a_restart(tmp_path: Path) -> None:
    ids = list(range(100, 100 + TOKENS))
    at_six, at_ten = boundary_state(filled(6, seed=1)), boundary_state(filled(TOKENS, seed=2))
    assert at_six is not None and at_ten is not None
    cache = kept(tmp_path)
    cache.store("a", ids, [], filled(TOKENS, seed=2), checkpoints={6: at_six, TOKENS: at_ten})
    cache.persist()
    restarted = kept(tmp_path)
    assert restarted.take("b", [*ids[:8], 0], []) is None, "another partition's"
    taken = restarted.take("a", [*ids[:8], 0], [])
    assert taken is not None and taken[1] == 6 and restarted.hits["disk"] == 1
    restored, _ = taken
    assert restored[0].offset == 6 and restored[0].keys.dtype == mx.bfloat16
    assert same_state([None, *restored[1:]], at_six)
    taken = restarted.take("a", [*ids, 0], [])
    assert taken is not None and taken[1] == TOKENS and same_state([None, *taken[0][1:]], at_ten)


def persisted_with_a_state(folder: Path) -> list[int]:
    """Prompt ids whose entry, with a recurrent state at its end, is persisted in `folder`."""
    ids = list(range(100, 100 + TOKENS))
    cache = kept(folder)
    state = boundary_state(filled(TOKENS))
    assert state is not None
    cache.store("a", ids, [], filled(TOKENS), checkpoints={TOKENS: state})
    cache.persist()
    return ids


def test_states_that_do_not_fit_the_model_are_skipped_and_removed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    ids = persisted_with_a_state(tmp_path)
    assert len(list(tmp_path.rglob("*.safetensors"))) == 1
    # The same namespace, but the layers are other kinds (a wrongly named folder, a changed model).
    other = kept(tmp_path, layers=lambda: [KVCache(), ArraysCache(2), RotatingKVCache(max_size=4)])
    with caplog.at_level(logging.WARNING):
        assert other.take("a", [*ids, 0], []) is None
    assert any("do not fit the model" in record.getMessage() for record in caplog.records)
    assert not list(tmp_path.rglob("*.safetensors")), "removed, so it is not tried again"


def test_a_damaged_state_file_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    ids = persisted_with_a_state(tmp_path)
    (path,) = tmp_path.rglob("*.safetensors")
    data = path.read_bytes()
    path.write_bytes(data[:-8] + bytes(8))  # the last state array's bytes
    with caplog.at_level(logging.WARNING):
        assert kept(tmp_path).take("a", [*ids, 0], []) is None
    assert any("checksum" in record.getMessage() for record in caplog.records)


def test_without_a_way_to_restore_states_nothing_is_written(tmp_path: Path) -> None:
    disk = PrefixDiskTier(tmp_path, namespace=NAMESPACE, max_bytes=1 << 24)
    cache = PrefixCache(min_tokens=4, max_bytes=1 << 24, disk=disk)
    state = boundary_state(filled(TOKENS))
    assert state is not None
    cache.store("a", list(range(TOKENS)), [], filled(TOKENS), checkpoints={TOKENS: state})
    cache.persist()
    assert not list(tmp_path.rglob("*.safetensors"))


@pytest.mark.parametrize("next_tokens", [1, 3])
@pytest.mark.parametrize("keep", [0, 1])
def test_a_window_kept_at_a_boundary_holds_only_the_window_and_continues_the_same(
    next_tokens: int, keep: int
) -> None:
    """Right after a multi-token update a sliding-window layer holds the window and the whole
    update; its boundary keeps only what is read again, and continues exactly as the live one."""
    rng = np.random.default_rng(5)

    def random(tokens: int) -> mx.array:
        return mx.array(rng.standard_normal((1, 1, tokens, 2)).astype(np.float32))

    live = RotatingKVCache(max_size=4, keep=keep)
    live.update_and_fetch(random(6), random(6))
    live.update_and_fetch(random(5), random(5))  # holds 3 + 5 positions now
    state = boundary_state([KVCache(), live])
    assert state is not None and state[1].keys.shape[2] == 4 < live.keys.shape[2]
    restored = state_from_arrays(*reversed(state_arrays(state)), templates()[:2])[1]
    keys, values = random(next_tokens), random(next_tokens)
    want = live.update_and_fetch(keys, values)
    got = restored.update_and_fetch(keys, values)
    assert all(mx.array_equal(a, b).item() for a, b in zip(got, want, strict=True))
    assert (restored.offset, restored._idx) == (live.offset, live._idx)
