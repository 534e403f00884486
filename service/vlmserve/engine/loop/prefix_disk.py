"""The prefix cache's disk tier: KV entries that outlive memory, restarts and one process.

An entry the in-memory prefix cache evicts (and every entry at shutdown) is written here as one
safetensors file (a safe format: no pickles), with its partition, token ids and image content
hashes in the file's metadata, so a later prompt of the same partition that starts the same way
can load it back instead of computing it again: after a restart, or from another engine process
of the same model sharing the folder. Files live in a folder per *namespace* (mlx-vlm's
`apc_disk_namespace`: model path, dtype and KV quantization folded into one fingerprint), so an
engine never reads another model's or another precision's entries.

Safety rules, each tested:
- a file's name is a hash (of namespace, partition, token ids and images): it reveals no prompt;
- a partition only ever matches its own entries (as in memory);
- writes are atomic (a temporary file in the same folder, fsync, `os.replace`);
- every entry carries a SHA-256 of its tensor bytes, checked on load; a corrupt, truncated or
  foreign file is skipped with a warning (and removed), never served;
- the folder is bounded in bytes (least recently used first; a hit touches the file);
- a full disk (or any write error of any type: safetensors raises its own `SafetensorError`)
  turns the tier off with one warning and drops what waits to be written: the engine goes on
  with memory only, and the writer thread never dies of it;
- only regular files are read, opened without blocking or following links (a FIFO named like an
  entry never hangs the engine: `prefix_disk_io.py`), and each load checks that the file still
  holds the indexed partition, token ids and images (a file swapped under the name is not served);
- scans and loads run on a thread of their own, waited for at most `io_timeout_s`: a folder that
  does not answer turns the tier off instead of hanging the generation thread.

An entry of a model whose layers are not all plain KV (recurrent, sliding-window, chunked: the
prefix cache's checkpointed entries) holds its plain layers as above, none for the others, and
their states at its boundaries (`Snapshots`: named arrays and the description kv/snapshot_codec.py
reads back into a fresh cache of the model); its boundary positions are in the metadata, so a
prompt is matched to the boundary it reaches without reading tensors, and in the file's name.

Arrays cross this module as numpy (bfloat16 as its uint16 bit pattern, named in the metadata):
converting to and from MLX is the caller's, on the generation thread. Writes run on a thread of
their own so eviction never waits for the disk; loads are synchronous for the caller (they
replace a prefill).
"""

from __future__ import annotations

import base64
import collections
import contextlib
import hashlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from vlmserve.engine.loop.prefix_disk_io import (
    SNAPSHOT_PREFIX,
    IoThread,
    LayerArrays,
    LoadedEntry,
    Snapshots,
    checksum,
    flatten,
    loaded_entry,
    open_regular,
    read_metadata,
    read_tensors,
)

__all__ = [
    "DiskEntry",
    "LayerArrays",
    "LoadedEntry",
    "PrefixDiskTier",
    "Snapshots",
    "disk_namespace",
    "entry_name",
]

log = logging.getLogger(__name__)

FORMAT = "vlmserve-prefix-kv-1"
# An entry with boundary states (its own format: an older engine skips it as another format's).
SNAPSHOT_FORMAT = "vlmserve-prefix-kv-snapshots-1"
SUFFIX = ".safetensors"
# Seconds a scan of the folder or one entry's load may take before the tier is turned off (a hung
# filesystem); generous: a real model's entry is hundreds of MiB.
IO_TIMEOUT_S = 30.0
T = TypeVar("T")
PromptImages = dict[int, tuple[int, str]]  # start -> (length, content hash), as in prefix_cache


@dataclass
class DiskEntry:
    """What the index knows of one file: enough to match a prompt without reading tensors."""

    path: Path
    partition: str
    token_ids: np.ndarray
    images: PromptImages
    nbytes: int
    dtypes: dict[str, str] = field(default_factory=dict)
    # The positions of its boundary states (an entry of layers not all plain KV); empty if none.
    checkpoints: tuple[int, ...] = ()


def entry_name(
    namespace: str,
    partition: str,
    token_ids: np.ndarray,
    images: PromptImages,
    checkpoints: Sequence[int] = (),
) -> str:
    digest = hashlib.sha256()
    for piece in (namespace, partition, _images_json(images)):
        digest.update(piece.encode())
        digest.update(b"\0")
    digest.update(np.ascontiguousarray(token_ids, dtype=np.int64).tobytes())
    if checkpoints:  # the same tokens with other boundaries is another entry
        digest.update(b"\0" + json.dumps(sorted(checkpoints)).encode())
    return digest.hexdigest() + SUFFIX


class PrefixDiskTier:
    """A folder of KV entries for one namespace. Generation thread, plus its own writer thread."""

    def __init__(
        self,
        folder: Path,
        *,
        namespace: str,
        max_bytes: int,
        on_error: Callable[[str], None] | None = None,
        io_timeout_s: float = IO_TIMEOUT_S,
    ) -> None:
        self.namespace = namespace
        self.io_timeout_s = io_timeout_s
        self._io = IoThread("prefix-disk-reader")
        self.max_bytes = max_bytes
        self.folder = Path(folder) / hashlib.sha256(namespace.encode()).hexdigest()[:32]
        self.enabled = max_bytes > 0
        self._on_error = on_error
        self._index: dict[str, DiskEntry] = {}
        # The index, the write queue and `enabled`, shared with the writer thread.
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a job queued or done, or closing
        self._seen_mtime_ns = -1
        self._jobs: collections.deque[_WriteJob] = collections.deque()
        self._writing: _WriteJob | None = None
        self._closing = False
        self._writer: threading.Thread | None = None
        if self.enabled:
            try:
                self.folder.mkdir(parents=True, exist_ok=True)
            except OSError as error:
                self._disable(f"prefix cache folder {self.folder} unusable: {error}")
            self.refresh()

    # -- the index ---------------------------------------------------------------------------

    def entries(self, partition: str) -> list[DiskEntry]:
        self.refresh()
        if not self.enabled:
            return []
        with self._lock:
            return [entry for entry in self._index.values() if entry.partition == partition]

    @property
    def bytes(self) -> int:
        with self._lock:
            return sum(entry.nbytes for entry in self._index.values())

    def __len__(self) -> int:
        with self._lock:
            return len(self._index)

    def __contains__(self, name: str) -> bool:
        with self._lock:
            return name in self._index

    def refresh(self) -> None:
        """Index files written since the last look (by this process or another one)."""
        self._off_thread(self._refresh, "scan")

    def _refresh(self) -> None:
        try:
            mtime = self.folder.stat().st_mtime_ns
            if mtime == self._seen_mtime_ns:
                return
            self._seen_mtime_ns = mtime
            # Regular files only: a FIFO, device or symlink named like an entry is never opened.
            with os.scandir(self.folder) as listing:
                names = {
                    item.name
                    for item in listing
                    if item.name.endswith(SUFFIX)
                    and not item.name.startswith(".tmp-")  # a writer's file, not yet an entry
                    and item.is_file(follow_symlinks=False)
                }
        except OSError as error:
            self._disable(f"prefix cache folder {self.folder} unreadable: {error}")
            return
        with self._lock:
            for gone in set(self._index) - names:
                del self._index[gone]
            new = names - set(self._index)
        for name in new:
            entry = self._read_header(self.folder / name)
            if entry is not None:
                with self._lock:
                    self._index[name] = entry

    def _read_header(self, path: Path) -> DiskEntry | None:
        try:
            with open_regular(path) as (fd, size):
                meta, _, _ = read_metadata(fd, size)
            return self._described(path, meta, size)
        except FileNotFoundError:
            return None
        except Exception as error:  # any unreadable file: skipped, never served
            self._reject(path, f"unreadable header ({error})")
            return None

    def _described(self, path: Path, meta: dict[str, str], size: int) -> DiskEntry:
        """The entry a file's metadata describes, checked to be this namespace's, under its name."""
        if meta.get("format") not in (FORMAT, SNAPSHOT_FORMAT) or meta.get("namespace") != self.namespace:
            raise ValueError("written by another model, precision or format")
        token_ids = np.frombuffer(base64.b64decode(meta["token_ids"]), dtype=np.int32).astype(np.int64)
        images = {int(k): (int(v[0]), str(v[1])) for k, v in json.loads(meta["images"]).items()}
        checkpoints: tuple[int, ...] = ()
        if meta["format"] == SNAPSHOT_FORMAT:
            checkpoints = tuple(sorted(int(at) for at in json.loads(meta["checkpoints"])))
            if not checkpoints or not all(0 < at <= token_ids.size for at in checkpoints):
                raise ValueError("boundaries outside its tokens")
        entry = DiskEntry(
            path, meta["partition"], token_ids, images, size, json.loads(meta["dtypes"]), checkpoints
        )
        if path.name != entry_name(self.namespace, entry.partition, token_ids, images, checkpoints):
            raise ValueError("its name does not match its contents")
        return entry

    # -- loading -----------------------------------------------------------------------------

    def load(self, entry: DiskEntry) -> LoadedEntry | None:
        """The entry's layers, after checking that the file is still the one indexed (partition,
        token ids, images) and its checksum; None (and the file gone) if it fails."""
        return self._off_thread(lambda: self._load(entry), "load")

    def _load(self, entry: DiskEntry) -> LoadedEntry | None:
        try:
            # One open: the metadata and the tensors from the same descriptor.
            with open_regular(entry.path) as (fd, size):
                meta, specs, start = read_metadata(fd, size)
                found = self._described(entry.path, meta, size)
                if not _same_prompt(found, entry):
                    raise ValueError("it was replaced since it was indexed")
                tensors = read_tensors(fd, size, specs, start)
            if checksum(tensors) != meta.get("sha256"):
                raise ValueError("checksum mismatch")
            loaded = loaded_entry(tensors, meta, found.checkpoints)
        except FileNotFoundError:
            self._forget(entry.path.name)
            return None
        except Exception as error:
            self._reject(entry.path, f"not served ({error})")
            return None
        with contextlib.suppress(OSError):
            os.utime(entry.path)  # least recently used goes first
        return loaded

    def _off_thread(self, work: Callable[[], T], what: str) -> T | None:
        """`work()` on the tier's I/O thread, waited for at most `io_timeout_s`: a folder that
        does not answer turns the tier off (memory only) instead of hanging the caller."""
        if not self.enabled:
            return None
        try:
            return self._io.run(work, self.io_timeout_s)
        except TimeoutError:
            self._disable(
                f"prefix cache folder {self.folder} did not answer a {what} in {self.io_timeout_s:g}s: "
                "disk tier off, memory only from now on"
            )
            return None

    # -- writing -----------------------------------------------------------------------------

    def put(
        self,
        partition: str,
        token_ids: np.ndarray,
        images: PromptImages,
        layers: Sequence[LayerArrays | None],
        dtypes: dict[str, str] | None = None,
        snapshots: Snapshots | None = None,
    ) -> None:
        """Queue one entry for writing (the writer thread does the disk work). A layer of None
        is kept only in `snapshots`."""
        if not self.enabled:
            return
        ids = np.ascontiguousarray(token_ids, dtype=np.int64)
        checkpoints = tuple(sorted(snapshots.positions)) if snapshots is not None else ()
        name = entry_name(self.namespace, partition, ids, images, checkpoints)
        if name in self:
            return
        tensors = flatten([layer for layer in layers if layer is not None])
        if snapshots is not None:
            tensors.update({SNAPSHOT_PREFIX + key: array for key, array in snapshots.arrays.items()})
        nbytes = sum(int(array.nbytes) for array in tensors.values())
        if nbytes > self.max_bytes:
            return
        meta = {
            "format": FORMAT,
            "namespace": self.namespace,
            "partition": partition,
            "token_ids": base64.b64encode(ids.astype(np.int32).tobytes()).decode(),
            "images": _images_json(images),
            "layers": str(len(layers)),
            "dtypes": json.dumps(dtypes or {}),
            "sha256": checksum(tensors),
        }
        if snapshots is not None:
            meta |= {
                "format": SNAPSHOT_FORMAT,
                "checkpoints": json.dumps(list(checkpoints)),
                "plain": json.dumps([index for index, layer in enumerate(layers) if layer is not None]),
                "snapshots": snapshots.description,
            }
        entry = DiskEntry(
            self.folder / name, partition, ids, dict(images), nbytes, dict(dtypes or {}), checkpoints
        )
        with self._changed:
            if not self.enabled or self._closing:
                return  # turned off meanwhile (by the writer): nothing may wait in memory
            self._jobs.append(_WriteJob(name, entry, tensors, meta))
            self._changed.notify_all()
            if self._writer is None:
                self._writer = threading.Thread(
                    target=self._write_loop, name="prefix-disk-writer", daemon=True
                )
                self._writer.start()

    @property
    def pending_bytes(self) -> int:
        """Tensor bytes queued or being written (held in memory until the writer is done)."""
        with self._lock:
            jobs = [*self._jobs, *([self._writing] if self._writing is not None else [])]
            return sum(job.entry.nbytes for job in jobs)

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every queued entry is on disk or given up (True), at most `timeout` s."""
        with self._changed:
            return self._changed.wait_for(lambda: not self._jobs and self._writing is None, timeout)

    def close(self, timeout: float | None = None) -> None:
        self._io.stop()
        with self._changed:
            self._closing = True
            self._changed.notify_all()
            writer, self._writer = self._writer, None
        if writer is not None:
            writer.join(timeout)

    def _write_loop(self) -> None:
        """The writer thread: one job at a time until closed. It never dies of a failed write:
        any error turns the tier off (and drops the queue), and the loop goes on to its end."""
        while True:
            with self._changed:
                self._changed.wait_for(lambda: self._jobs or self._closing)
                if not self._jobs:
                    return
                job = self._writing = self._jobs.popleft()
            try:
                if self.enabled:
                    self._write(job)
            except Exception as error:  # safetensors raises SafetensorError on a full disk, not OSError
                self._disable(f"prefix cache disk tier off, memory only from now on: {error}")
            finally:
                with self._changed:
                    self._writing = None
                    self._changed.notify_all()

    def _write(self, job: _WriteJob) -> None:
        from safetensors.numpy import save_file

        tmp = None
        try:
            fd, tmp = tempfile.mkstemp(dir=self.folder, prefix=".tmp-", suffix=SUFFIX)
            os.close(fd)
            save_file(job.tensors, tmp, metadata=job.meta)
            with open(tmp, "rb+") as handle:
                os.fsync(handle.fileno())
            os.replace(tmp, job.entry.path)
            tmp = None
            job.entry.nbytes = job.entry.path.stat().st_size
        finally:
            if tmp is not None:
                with contextlib.suppress(OSError):
                    os.unlink(tmp)
        with self._lock:
            self._index[job.name] = job.entry
        self._evict()

    def _evict(self) -> None:
        """Remove least recently used files until the folder is under its byte bound."""
        with self._lock:
            total = sum(entry.nbytes for entry in self._index.values())
            if total <= self.max_bytes:
                return
            by_age = sorted(self._index.items(), key=lambda item: _mtime(item[1].path))
        for name, entry in by_age:
            if total <= self.max_bytes:
                break
            with contextlib.suppress(OSError):
                entry.path.unlink()
            self._forget(name)
            total -= entry.nbytes

    # -- failures ----------------------------------------------------------------------------

    def reject(self, entry: DiskEntry, why: str) -> None:
        """A loaded entry its reader could not use: skipped with a warning and removed."""
        self._reject(entry.path, why)

    def _reject(self, path: Path, why: str) -> None:
        log.warning("prefix cache file %s skipped: %s", path.name, why)
        if self._on_error is not None:
            self._on_error("rejected")
        with contextlib.suppress(OSError):
            path.unlink()
        self._forget(path.name)

    def _forget(self, name: str) -> None:
        with self._lock:
            self._index.pop(name, None)

    def _disable(self, why: str) -> None:
        """Turn the tier off (once: one warning, one count) and drop the entries waiting to be
        written, so nothing evicted waits in memory for a disk that will not take it."""
        with self._changed:
            was, self.enabled = self.enabled, False
            self._jobs.clear()
            self._changed.notify_all()
        if was:
            log.warning("%s", why)
            if self._on_error is not None:
                self._on_error("disabled")


@dataclass(frozen=True, slots=True)
class _WriteJob:
    name: str
    entry: DiskEntry
    tensors: dict[str, np.ndarray]
    meta: dict[str, str]


def disk_namespace(model: str, loaded: Any) -> str:
    """One model's namespace: mlx-vlm's APC fingerprint of its path, folded with what else
    changes its KV: the weights (file names, sizes, modification times), the dtype they run in,
    and the KV's quantization (--kv-bits)."""
    from mlx.utils import tree_flatten
    from mlx_vlm.apc import apc_disk_namespace

    path = Path(model)
    weights = (
        sorted(f"{p.name}:{p.stat().st_size}:{p.stat().st_mtime_ns}" for p in path.glob("*.safetensors"))
        if path.is_dir()
        else []
    )
    parameters: list[Any] = list(tree_flatten(loaded.model.language_model.parameters()))
    dtype = str(parameters[0][1].dtype) if parameters else ""
    where = str(path.resolve()) if path.is_dir() else model
    layout = loaded.kv_layout
    return str(
        apc_disk_namespace(
            where,
            weights_fingerprint="|".join([dtype, *weights]),
            kv_bits=layout.bits,
            kv_group_size=layout.group_size if layout.bits is not None and not layout.turbo else None,
            kv_quant_scheme=layout.scheme if layout.turbo else None,
        )
    )


def _same_prompt(found: DiskEntry, indexed: DiskEntry) -> bool:
    return (
        found.partition == indexed.partition
        and np.array_equal(found.token_ids, indexed.token_ids)
        and found.images == indexed.images
        and found.dtypes == indexed.dtypes
        and found.checkpoints == indexed.checkpoints
    )


def _images_json(images: PromptImages) -> str:
    return json.dumps({str(k): [v[0], v[1]] for k, v in sorted(images.items())}, separators=(",", ":"))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
