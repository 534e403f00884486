"""The prefix disk tier's reads: one file opened safely, its safetensors layout read from that
descriptor, and a thread that runs the folder's reads so a caller can stop waiting.

The folder is shared between engines by design, so a file named like an entry may be anything.
safetensors opens files by path only, and holds the GIL while it opens and reads: a FIFO named
like an entry blocked its open forever and stopped every thread of the engine (signal handlers
included: SIGTERM was ignored). So a file is opened here with `O_NONBLOCK | O_NOFOLLOW` (a FIFO's
open returns at once, a symlink is refused), checked to be a regular file on the descriptor
itself (no window for a swap), and read from that descriptor with plain reads, which release the
GIL. The layout read is safetensors' own (an 8-byte little-endian header length, a JSON header
of `__metadata__` and each tensor's dtype, shape and byte range, then the bytes); files are
written with `safetensors.numpy.save_file`. Every field is bounded before it is used.

`IoThread` runs the folder's scans and loads off the generation thread: a hung filesystem (a
stuck network mount) makes the caller stop waiting after a timeout instead of hanging the engine.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import queue
import stat
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

__all__ = [
    "SNAPSHOT_PREFIX",
    "IoThread",
    "LayerArrays",
    "LoadedEntry",
    "Snapshots",
    "checksum",
    "flatten",
    "loaded_entry",
    "open_regular",
    "read_metadata",
    "read_tensors",
    "unflatten",
]

T = TypeVar("T")
# A layer is (keys, values), each one array or, for a quantized cache, a tuple of arrays.
LayerArrays = tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]

# The names of boundary-state tensors (plain layers' are `layer.k|v.part`).
SNAPSHOT_PREFIX = "s."
# safetensors' own bound on a header; ours hold token ids (base64) and image hashes besides.
MAX_HEADER_BYTES = 100_000_000
_DTYPES = {
    "BOOL": "|b1",
    "U8": "|u1",
    "I8": "|i1",
    "U16": "<u2",
    "I16": "<i2",
    "F16": "<f2",
    "U32": "<u4",
    "I32": "<i4",
    "F32": "<f4",
    "U64": "<u8",
    "I64": "<i8",
    "F64": "<f8",
}


@contextmanager
def open_regular(path: Path) -> Iterator[tuple[int, int]]:
    """(descriptor, size) of `path`, a regular file: a FIFO, device, socket or symlink is refused
    (ValueError / OSError) without blocking."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise ValueError("not a regular file")
        yield fd, info.st_size
    finally:
        os.close(fd)


def read_metadata(fd: int, size: int) -> tuple[dict[str, str], dict[str, Any], int]:
    """(the file's `__metadata__`, its tensors' specs, where their bytes start)."""
    length = int.from_bytes(_read(fd, 8, 0), "little")
    if length > min(MAX_HEADER_BYTES, size - 8):
        raise ValueError(f"header length {length} out of range")
    header = json.loads(_read(fd, length, 8))
    if not isinstance(header, dict):
        raise ValueError("header is not an object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise ValueError("metadata is not a map of strings")
    return meta, header, 8 + length


def read_tensors(fd: int, size: int, specs: dict[str, Any], start: int) -> dict[str, np.ndarray]:
    """Each tensor, read into its own array (its byte range checked against its dtype, shape and
    the file's size first)."""
    tensors: dict[str, np.ndarray] = {}
    with os.fdopen(fd, "rb", buffering=0, closefd=False) as handle:
        for name, spec in specs.items():
            if not isinstance(spec, dict) or spec.get("dtype") not in _DTYPES:
                raise ValueError(f"tensor {name!r}: unknown dtype")
            shape, offsets = spec.get("shape"), spec.get("data_offsets")
            if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
                raise ValueError(f"tensor {name!r}: bad shape")
            if (
                not isinstance(offsets, list)
                or len(offsets) != 2
                or not all(isinstance(o, int) for o in offsets)
            ):
                raise ValueError(f"tensor {name!r}: bad byte range")
            dtype = np.dtype(_DTYPES[spec["dtype"]])
            begin, end = offsets
            if not 0 <= begin <= end <= size - start or end - begin != math.prod(shape) * dtype.itemsize:
                raise ValueError(f"tensor {name!r}: byte range does not fit its shape or the file")
            array = np.empty(shape, dtype)
            if array.nbytes:
                handle.seek(start + begin)
                view = array.data.cast("B")
                got = 0
                while got < len(view):
                    count = handle.readinto(view[got:])
                    if not count:
                        raise ValueError("truncated")
                    got += count
            tensors[name] = array
    return tensors


def flatten(layers: Sequence[LayerArrays]) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for i, (keys, values) in enumerate(layers):
        for kind, parts in (("k", keys), ("v", values)):
            for j, part in enumerate(parts):
                tensors[f"{i}.{kind}.{j}"] = np.ascontiguousarray(part)
    return tensors


def unflatten(tensors: dict[str, np.ndarray], count: int) -> list[LayerArrays]:
    layers: list[LayerArrays] = []
    for i in range(count):
        parts = []
        for kind in ("k", "v"):
            j, pieces = 0, []
            while (name := f"{i}.{kind}.{j}") in tensors:
                pieces.append(tensors[name])
                j += 1
            if not pieces:
                raise ValueError(f"layer {i} has no {kind} arrays")
            parts.append(tuple(pieces))
        layers.append((parts[0], parts[1]))
    if len(tensors) != sum(len(k) + len(v) for k, v in layers):
        raise ValueError("arrays beyond the layers it names")
    return layers


@dataclass(frozen=True, slots=True)
class Snapshots:
    """An entry's boundary states: their positions, their arrays by name (numpy) and the
    description that says how they make the layers (JSON text, the caller's to read)."""

    positions: tuple[int, ...]
    arrays: dict[str, np.ndarray]
    description: str


@dataclass(frozen=True, slots=True)
class LoadedEntry:
    """A loaded entry: its plain layers' arrays (None for a layer kept only in `snapshots`)."""

    layers: list[LayerArrays | None]
    snapshots: Snapshots | None


def loaded_entry(
    tensors: dict[str, np.ndarray], meta: dict[str, str], checkpoints: tuple[int, ...]
) -> LoadedEntry:
    """The plain layers at their places and, for an entry with boundary states, those."""
    count = int(meta["layers"])
    if not checkpoints:
        return LoadedEntry(list(unflatten(tensors, count)), None)
    states = {
        name.removeprefix(SNAPSHOT_PREFIX): tensors.pop(name)
        for name in [name for name in tensors if name.startswith(SNAPSHOT_PREFIX)]
    }
    plain = json.loads(meta["plain"])
    if not isinstance(plain, list) or sorted(set(plain)) != plain or not all(0 <= i < count for i in plain):
        raise ValueError("plain layers out of range")
    layers: list[LayerArrays | None] = [None] * count
    for index, arrays in zip(plain, unflatten(tensors, len(plain)), strict=True):
        layers[index] = arrays
    return LoadedEntry(layers, Snapshots(checkpoints, states, meta["snapshots"]))


def checksum(tensors: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _read(fd: int, count: int, offset: int) -> bytes:
    data = os.pread(fd, count, offset)
    if len(data) != count:
        raise ValueError("truncated")
    return data


class IoThread:
    """One daemon thread running the folder's reads. `run` waits for one at most `timeout` s
    (TimeoutError then): the thread stays on it, a daemon that does not hold the process up."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], Any], Future[Any]] | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def run(self, work: Callable[[], T], timeout: float) -> T:
        future: Future[T] = Future()
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
        self._jobs.put((work, future))
        return future.result(timeout)

    def stop(self) -> None:
        with self._lock:
            if self._thread is not None:
                self._jobs.put(None)
                self._thread = None

    def _loop(self) -> None:
        while (job := self._jobs.get()) is not None:
            work, future = job
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(work())
            except BaseException as error:  # handed to the caller, who decides
                future.set_exception(error)
