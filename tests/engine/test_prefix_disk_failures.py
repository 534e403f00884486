"""The prefix cache's disk tier under failure (issue 39): a write error of any kind turns the tier
off with one warning and drops its queue, and the writer never dies silently.

Pure (numpy arrays, no model)."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from safetensors import SafetensorError

from vlmserve.engine.loop.prefix_cache import PrefixCache
from vlmserve.engine.loop.prefix_disk import PrefixDiskTier

from .test_prefix_cache import TOKEN_BYTES, layers_for, spans_of
from .test_prefix_disk import NAMESPACE, layer_arrays

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
