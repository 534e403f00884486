"""The prefix cache's disk tier: entries survive eviction, restarts and processes; a file that is
corrupt, truncated, foreign or from another partition is never served; bounds and a full disk.

Pure (numpy arrays, no model): the real-engine restart test is in test_prefix_cache_restart.py."""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from vlmserve.engine.loop.prefix_cache import PrefixCache
from vlmserve.engine.loop.prefix_disk import PrefixDiskTier, entry_name

from .test_prefix_cache import TOKEN_BYTES, layers_for, spans_of

NAMESPACE = "models/qwen2-vl-tiny#s1-0000abcd"


def tier(folder: Path, *, namespace: str = NAMESPACE, max_bytes: int = 1 << 20) -> PrefixDiskTier:
    return PrefixDiskTier(folder, namespace=namespace, max_bytes=max_bytes)


def layer_arrays(ids: list[int]) -> list[tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]]:
    return [((layer.keys,), (layer.values,)) for layer in layers_for(ids)]


def written(disk: PrefixDiskTier, partition: str, ids: list[int]) -> None:
    disk.put(partition, np.asarray(ids), {}, layer_arrays(ids))
    disk.flush()


def files(disk: PrefixDiskTier) -> list[Path]:
    return sorted(disk.folder.glob("*.safetensors"))


def test_an_entry_round_trips_with_its_partition_ids_and_arrays(tmp_path: Path) -> None:
    ids = list(range(12))
    disk = tier(tmp_path)
    written(disk, "a", ids)
    # Another process (or this one after a restart) opening the same folder finds it.
    reopened = tier(tmp_path)
    (entry,) = reopened.entries("a")
    assert entry.token_ids.tolist() == ids
    loaded = reopened.load(entry)
    assert loaded is not None and loaded.snapshots is None
    for pair, (want_k, want_v) in zip(loaded.layers, layer_arrays(ids), strict=True):
        assert pair is not None
        keys, values = pair
        np.testing.assert_array_equal(keys[0], want_k[0])
        np.testing.assert_array_equal(values[0], want_v[0])


def test_file_names_reveal_no_prompt_and_partitions_stay_apart(tmp_path: Path) -> None:
    disk = tier(tmp_path)
    written(disk, "tenant-a", [101, 102, 103, 104, 105])
    (path,) = files(disk)
    assert path.name == entry_name(NAMESPACE, "tenant-a", np.asarray([101, 102, 103, 104, 105]), {})
    assert "101" not in path.name and "tenant" not in path.name
    assert tier(tmp_path).entries("tenant-b") == []


@pytest.mark.parametrize(
    "damage",
    [
        pytest.param(lambda data: data[: len(data) // 2], id="truncated"),
        pytest.param(lambda data: data[:-8] + bytes(8), id="tensor bytes changed"),
        pytest.param(lambda data: b"\xff" * 16, id="garbage"),
    ],
)
def test_a_damaged_file_is_skipped_with_a_warning_never_served(
    tmp_path: Path, damage: Any, caplog: pytest.LogCaptureFixture
) -> None:
    disk = tier(tmp_path)
    written(disk, "a", list(range(12)))
    (path,) = files(disk)
    entry = tier(tmp_path).entries("a")
    path.write_bytes(damage(path.read_bytes()))
    with caplog.at_level(logging.WARNING):
        reopened = tier(tmp_path)
        found = reopened.entries("a")
        served = [reopened.load(e) for e in found] + ([reopened.load(entry[0])] if not found else [])
    assert all(layers is None for layers in served)
    assert any("skipped" in record.getMessage() for record in caplog.records)
    assert not path.exists()  # removed, so it is not tried again


def test_a_foreign_models_file_is_skipped(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    other = tier(tmp_path, namespace="models/other#s1-00000001")
    written(other, "a", list(range(12)))
    # Copied into our namespace's folder by hand: its metadata still names the other model.
    ours = tier(tmp_path)
    (path,) = files(other)
    os.replace(path, ours.folder / path.name)
    with caplog.at_level(logging.WARNING):
        assert tier(tmp_path).entries("a") == []
    assert any("another model" in record.getMessage() for record in caplog.records)


def test_a_renamed_file_is_not_served_for_another_prompt(tmp_path: Path) -> None:
    disk = tier(tmp_path)
    written(disk, "a", list(range(12)))
    (path,) = files(disk)
    os.replace(path, disk.folder / entry_name(NAMESPACE, "b", np.arange(12), {}))
    assert tier(tmp_path).entries("b") == []


def test_the_folder_stays_under_its_byte_bound_least_recently_used_first(tmp_path: Path) -> None:
    first = tier(tmp_path)
    written(first, "a", list(range(40)))
    one_file = files(first)[0].stat().st_size
    disk = tier(tmp_path, max_bytes=int(one_file * 2.5))
    written(disk, "a", list(range(100, 140)))
    os.utime(files(disk)[0], (1, 1))  # make the first one clearly older ...
    old = next(e for e in disk.entries("a") if e.token_ids[0] == 0)
    assert disk.load(old) is not None  # ... then use it: now the other one is older
    written(disk, "a", list(range(200, 240)))
    kept = sorted(int(e.token_ids[0]) for e in tier(tmp_path).entries("a"))
    assert kept == [0, 200]
    assert sum(p.stat().st_size for p in files(disk)) <= disk.max_bytes


def test_a_full_disk_degrades_to_memory_only(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    import safetensors.numpy

    def no_space(*args: Any, **kwargs: Any) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(safetensors.numpy, "save_file", no_space)
    cache = PrefixCache(min_tokens=4, max_bytes=TOKEN_BYTES * 12, disk=tier(tmp_path))
    with caplog.at_level(logging.WARNING):
        for start in (0, 100, 200):
            ids = list(range(start, start + 10))
            cache.store("a", ids, spans_of(ids), layers_for(ids))
        assert cache.disk is not None
        cache.disk.flush()
    assert not cache.disk.enabled
    assert [r.getMessage() for r in caplog.records if "memory only" in r.getMessage()]
    assert list(cache.disk.folder.iterdir()) == []  # nothing half-written left behind
    # Memory goes on serving.
    ids = list(range(200, 210))
    assert cache.take("a", [*ids, 7], spans_of(ids)) is not None


def test_an_evicted_entry_comes_back_from_disk(tmp_path: Path) -> None:
    cache = PrefixCache(min_tokens=4, max_bytes=TOKEN_BYTES * 12, disk=tier(tmp_path))
    first, second = list(range(10)), list(range(100, 110))
    cache.store("a", first, spans_of(first), layers_for(first))
    cache.store("a", second, spans_of(second), layers_for(second))  # evicts `first` to disk
    assert len(cache) == 1
    assert cache.disk is not None
    cache.disk.flush()
    taken = cache.take("a", [*first[:8], 77], spans_of(first))
    assert taken is not None
    layers, n = taken
    assert n == 8
    assert cache.hits == {"memory": 0, "disk": 1}
    np.testing.assert_array_equal(np.asarray(layers[0].keys)[0, 0, :, 0], np.arange(8, dtype=np.float32))
    # Another partition never sees it, on disk either.
    assert cache.take("b", [*first[:8], 77], spans_of(first)) is None


def test_persist_writes_every_entry_and_a_restarted_cache_finds_it(tmp_path: Path) -> None:
    cache = PrefixCache(min_tokens=4, max_bytes=1 << 20, disk=tier(tmp_path))
    ids = list(range(10))
    cache.store("a", ids, spans_of(ids), layers_for(ids))
    cache.persist()
    restarted = PrefixCache(min_tokens=4, max_bytes=1 << 20, disk=tier(tmp_path))
    taken = restarted.take("a", [*ids, 5], spans_of(ids))
    assert taken is not None and taken[1] == 10
    assert restarted.hits["disk"] == 1


def test_images_must_match_on_disk_as_in_memory(tmp_path: Path) -> None:
    cache = PrefixCache(min_tokens=4, max_bytes=1 << 20, disk=tier(tmp_path))
    ids = [1, 2, 900, 900, 900, 900, 3, 4, 5]
    cache.store("a", ids, spans_of(ids, ("red",)), layers_for(ids))
    cache.persist()
    restarted = PrefixCache(min_tokens=2, max_bytes=1 << 20, disk=tier(tmp_path))
    taken = restarted.take("a", [*ids, 6], spans_of(ids, ("blue",)))
    assert taken is not None and taken[1] == 2  # only the tokens before the (different) image
