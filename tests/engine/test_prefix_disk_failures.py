"""The prefix cache's disk tier under failure (issue 39): a write error of any kind turns the tier
off with one warning and drops its queue, and the writer never dies silently; FIFOs, symlinks and
files swapped under an indexed name are never opened or served; a folder that does not answer
turns the tier off instead of hanging the engine.

Pure (numpy arrays, no model)."""

from __future__ import annotations

import json
import logging
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import SafetensorError

from vlmserve.engine.loop.prefix_cache import PrefixCache
from vlmserve.engine.loop.prefix_disk import PrefixDiskTier, entry_name
from vlmserve.engine.loop.prefix_disk_io import open_regular, read_metadata, read_tensors

from .test_prefix_cache import TOKEN_BYTES, layers_for, spans_of
from .test_prefix_disk import NAMESPACE, files, layer_arrays, tier, written

# What safetensors 0.8 raises on a full disk (its Rust writer's io::Error, not an OSError).
DISK_FULL = SafetensorError("Error while serializing: I/O error: No space left on device (os error 28)")


class FailingSave:
    """`safetensors.numpy.save_file` that holds its first call until released, then raises."""

    def __init__(self, error: BaseException) -> None:
        self.error = error
        self.calls = 0
        self.entered = threading.Event()
        self.release = threading.Event()

    def __call__(self, *args: Any, **kwargs: Any) -> None:
        self.calls += 1
        self.entered.set()
        assert self.release.wait(10)
        raise self.error


@pytest.fixture
def thread_failures(monkeypatch: pytest.MonkeyPatch) -> list[BaseException]:
    """Exceptions that ended a thread (a writer that died)."""
    failures: list[BaseException] = []
    monkeypatch.setattr(threading, "excepthook", lambda args: failures.append(args.exc_value))
    return failures


def flushed(disk: PrefixDiskTier) -> bool:
    """Whether `flush()` returns within a few seconds (a dead writer makes it wait forever)."""
    done = threading.Event()
    threading.Thread(target=lambda: (disk.flush(), done.set()), daemon=True).start()
    return done.wait(5)


@pytest.mark.parametrize(
    "error",
    [
        pytest.param(DISK_FULL, id="SafetensorError (full disk)"),
        pytest.param(OSError(28, "No space left on device"), id="OSError"),
        pytest.param(RuntimeError("anything else"), id="RuntimeError"),
    ],
)
def test_a_write_error_turns_the_tier_off_once_and_drops_its_queue(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    thread_failures: list[BaseException],
    error: BaseException,
) -> None:
    import safetensors.numpy

    save = FailingSave(error)
    monkeypatch.setattr(safetensors.numpy, "save_file", save)
    kinds: list[str] = []
    disk = PrefixDiskTier(tmp_path, namespace=NAMESPACE, max_bytes=1 << 20, on_error=kinds.append)
    with caplog.at_level(logging.WARNING):
        for start in range(0, 50, 10):  # the first is being written, four wait behind it
            ids = list(range(start, start + 10))
            disk.put("a", np.asarray(ids), {}, layer_arrays(ids))
        assert save.entered.wait(5)
        assert disk.pending_bytes > 0
        save.release.set()
        assert flushed(disk)
        # Later evictions are not queued either.
        disk.put("a", np.arange(100, 110), {}, layer_arrays(list(range(100, 110))))
    assert not disk.enabled
    assert save.calls == 1  # the queue was dropped, not written one failure at a time
    assert disk.pending_bytes == 0
    assert thread_failures == []
    assert kinds == ["disabled"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and "memory only" in warnings[0], warnings
    assert [p.name for p in disk.folder.iterdir()] == []  # nothing half-written left behind
    disk.close()


def test_after_a_full_disk_evictions_do_not_pile_up_in_memory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, thread_failures: list[BaseException]
) -> None:
    import safetensors.numpy

    def full(*args: Any, **kwargs: Any) -> None:
        raise DISK_FULL

    monkeypatch.setattr(safetensors.numpy, "save_file", full)
    disk = PrefixDiskTier(tmp_path, namespace=NAMESPACE, max_bytes=1 << 20)
    cache = PrefixCache(min_tokens=4, max_bytes=TOKEN_BYTES * 12, disk=disk)
    for start in range(0, 1500, 10):  # 150 requests, each evicting the one before
        ids = list(range(start, start + 10))
        cache.store("a", ids, spans_of(ids), layers_for(ids))
    assert flushed(disk)
    assert not disk.enabled
    assert disk.pending_bytes == 0
    assert thread_failures == []
    ids = list(range(1490, 1500))
    assert cache.take("a", [*ids, 7], spans_of(ids)) is not None  # memory goes on serving
    cache.persist()  # shutdown does not wait on a writer that is gone


# -- files that are not what their names say (issue 39.6) -------------------------------------


def returns_within(seconds: float, work: Any) -> tuple[bool, Any]:
    """(whether `work()` returned in time, its value): a FIFO's open would block forever."""
    result: list[Any] = []
    thread = threading.Thread(target=lambda: result.append(work()), daemon=True)
    thread.start()
    thread.join(seconds)
    return bool(result), result[0] if result else None


def fake_name(tag: str) -> str:
    return entry_name(NAMESPACE, tag, np.arange(12), {})


def test_a_fifo_named_like_an_entry_is_never_opened(tmp_path: Path) -> None:
    disk = tier(tmp_path)
    written(disk, "a", list(range(12)))
    os.mkfifo(disk.folder / fake_name("fifo"))
    done, reopened = returns_within(5, lambda: tier(tmp_path))
    assert done, "indexing opened the FIFO and waited for a writer"
    assert [e.token_ids.tolist() for e in reopened.entries("a")] == [list(range(12))]
    assert reopened.enabled


def test_a_symlink_named_like_an_entry_is_not_indexed(tmp_path: Path) -> None:
    elsewhere = tier(tmp_path / "elsewhere")
    written(elsewhere, "a", list(range(12)))
    (target,) = files(elsewhere)
    disk = tier(tmp_path / "here")
    (disk.folder / target.name).symlink_to(target)
    assert tier(tmp_path / "here").entries("a") == []
    # /dev/zero behind an entry's name: not read either.
    (disk.folder / fake_name("zero")).symlink_to("/dev/zero")
    done, entries = returns_within(5, lambda: tier(tmp_path / "here").entries("a"))
    assert done and entries == []


def test_a_fifo_swapped_in_after_indexing_is_not_opened(tmp_path: Path) -> None:
    disk = tier(tmp_path)
    written(disk, "a", list(range(12)))
    (entry,) = disk.entries("a")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    os.replace(fifo, entry.path)
    done, layers = returns_within(5, lambda: disk.load(entry))
    assert done, "loading opened the FIFO and waited for a writer"
    assert layers is None
    assert disk.enabled


@pytest.mark.parametrize(
    ("partition", "ids"),
    [
        pytest.param("b", list(range(12)), id="another partition's entry"),
        pytest.param("a", list(range(20)), id="another token count"),
        pytest.param("a", [*range(11), 99], id="other token ids"),
    ],
)
def test_a_file_swapped_under_an_indexed_name_is_not_served(
    tmp_path: Path, partition: str, ids: list[int], caplog: pytest.LogCaptureFixture
) -> None:
    disk = tier(tmp_path)
    written(disk, "a", list(range(12)))
    (entry,) = disk.entries("a")
    written(disk, partition, ids)
    (other,) = (e for e in disk.entries(partition) if e.path != entry.path)
    os.replace(other.path, entry.path)  # a valid file, checksum and all, under the indexed name
    with caplog.at_level(logging.WARNING):
        assert disk.load(entry) is None
    assert any("skipped" in r.getMessage() for r in caplog.records)


def test_a_file_swapped_with_other_images_is_not_served(tmp_path: Path) -> None:
    disk = tier(tmp_path)
    ids = [1, 2, 900, 900, 3, 4, 5, 6]
    disk.put("a", np.asarray(ids), {2: (2, "red")}, layer_arrays(ids))
    disk.flush()
    (entry,) = disk.entries("a")
    disk.put("a", np.asarray(ids), {2: (2, "blue")}, layer_arrays(ids))
    disk.flush()
    (other,) = (e for e in disk.entries("a") if e.path != entry.path)
    os.replace(other.path, entry.path)
    assert disk.load(entry) is None


def test_a_folder_that_does_not_answer_turns_the_tier_off_instead_of_hanging(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """A hung filesystem (a stuck network mount): the scan runs off the caller's thread, which
    stops waiting after the tier's I/O timeout."""
    disk = PrefixDiskTier(tmp_path, namespace=NAMESPACE, max_bytes=1 << 20, io_timeout_s=0.5)
    written(disk, "a", list(range(12)))
    hung = threading.Event()
    real_scandir = os.scandir

    def stuck(path: Any) -> Any:
        hung.wait(10)
        return real_scandir(path)

    monkeypatch.setattr(os, "scandir", stuck)
    (disk.folder / "touch").write_bytes(b"")  # the folder changed: the next look scans it
    with caplog.at_level(logging.WARNING):
        done, entries = returns_within(3, lambda: disk.entries("a"))
    hung.set()
    assert done and entries == []
    assert not disk.enabled
    assert any("did not answer" in r.getMessage() for r in caplog.records)


def safetensors_bytes(header: Any, data: bytes = b"", length: int | None = None) -> bytes:
    encoded = json.dumps(header).encode()
    return (len(encoded) if length is None else length).to_bytes(8, "little") + encoded + data


F32_4 = {"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}


@pytest.mark.parametrize(
    ("content", "why"),
    [
        pytest.param(safetensors_bytes({}, length=1 << 63), "out of range", id="header length 2^63"),
        pytest.param(
            safetensors_bytes({"a": F32_4}, length=10_000), "out of range", id="header past the end"
        ),
        pytest.param(b"\x05\x00", "truncated", id="shorter than a header length"),
        pytest.param(safetensors_bytes([1, 2]), "not an object", id="header a list"),
        pytest.param(
            safetensors_bytes({"__metadata__": {"a": 1}}), "map of strings", id="metadata not strings"
        ),
        pytest.param(safetensors_bytes({"a": F32_4}, bytes(8)), "does not fit", id="bytes past the end"),
        pytest.param(
            safetensors_bytes({"a": {**F32_4, "shape": [5]}}, bytes(16)), "does not fit", id="shape != bytes"
        ),
        pytest.param(
            safetensors_bytes({"a": {**F32_4, "shape": [-4]}}, bytes(16)), "bad shape", id="negative shape"
        ),
        pytest.param(
            safetensors_bytes({"a": {**F32_4, "dtype": "object"}}, bytes(16)),
            "unknown dtype",
            id="unknown dtype",
        ),
        pytest.param(
            safetensors_bytes({"a": {**F32_4, "data_offsets": [0, 1 << 70]}}, bytes(16)),
            "does not fit",
            id="offset 2^70",
        ),
    ],
)
def test_a_hostile_layout_is_refused_before_anything_is_allocated(
    tmp_path: Path, content: bytes, why: str
) -> None:
    path = tmp_path / "entry.safetensors"
    path.write_bytes(content)
    with pytest.raises(ValueError, match=why), open_regular(path) as (fd, size):
        _, specs, start = read_metadata(fd, size)
        read_tensors(fd, size, specs, start)


def test_a_layout_written_by_safetensors_reads_back(tmp_path: Path) -> None:
    from safetensors.numpy import save_file

    arrays = {
        "f32": np.arange(12, dtype=np.float32).reshape(3, 4),
        "u16": np.arange(5, dtype=np.uint16),
        "i8": np.array([-1, 2], dtype=np.int8),
        "empty": np.zeros((0, 3), dtype=np.float16),
    }
    save_file(arrays, str(tmp_path / "x.safetensors"), metadata={"k": "v"})
    with open_regular(tmp_path / "x.safetensors") as (fd, size):
        meta, specs, start = read_metadata(fd, size)
        tensors = read_tensors(fd, size, specs, start)
    assert meta == {"k": "v"}
    assert tensors.keys() == arrays.keys()
    for name, array in arrays.items():
        assert tensors[name].dtype == array.dtype
        np.testing.assert_array_equal(tensors[name], array)
