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
- a full disk (or any write error) turns the tier off with one warning: the engine goes on with
  memory only.

Arrays cross this module as numpy (bfloat16 as its uint16 bit pattern, named in the metadata):
converting to and from MLX is the caller's, on the generation thread. Writes run on a thread of
their own so eviction never waits for the disk; loads are synchronous (they replace a prefill).
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
from typing import Any

import numpy as np

__all__ = ["DiskEntry", "LayerArrays", "PrefixDiskTier", "disk_namespace", "entry_name"]

log = logging.getLogger(__name__)

FORMAT = "vlmserve-prefix-kv-1"
SUFFIX = ".safetensors"
# A layer is (keys, values), each one array or, for a quantized cache, a tuple of arrays.
LayerArrays = tuple[tuple[np.ndarray, ...], tuple[np.ndarray, ...]]
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


def entry_name(namespace: str, partition: str, token_ids: np.ndarray, images: PromptImages) -> str:
    digest = hashlib.sha256()
    for piece in (namespace, partition, _images_json(images)):
        digest.update(piece.encode())
        digest.update(b"\0")
    digest.update(np.ascontiguousarray(token_ids, dtype=np.int64).tobytes())
    return digest.hexdigest() + SUFFIX


class PrefixDiskTier:
    """A folder of KV entries for one namespace. Generation thread, plus its own writer thread."""

    def __init__(
        self, folder: Path, *, namespace: str, max_bytes: int, on_error: Callable[[str], None] | None = None
    ) -> None:
        self.namespace = namespace
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
        if not self.enabled:
            return
        try:
            mtime = self.folder.stat().st_mtime_ns
            if mtime == self._seen_mtime_ns:
                return
            self._seen_mtime_ns = mtime
            names = {p.name for p in self.folder.iterdir() if p.name.endswith(SUFFIX)}
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
        from safetensors import safe_open

        try:
            with safe_open(str(path), framework="numpy") as handle:  # reads the header only
                meta = handle.metadata() or {}
            if meta.get("format") != FORMAT or meta.get("namespace") != self.namespace:
                raise ValueError("written by another model, precision or format")
            token_ids = np.frombuffer(base64.b64decode(meta["token_ids"]), dtype=np.int32).astype(np.int64)
            images = {int(k): (int(v[0]), str(v[1])) for k, v in json.loads(meta["images"]).items()}
            entry = DiskEntry(
                path, meta["partition"], token_ids, images, path.stat().st_size, json.loads(meta["dtypes"])
            )
            if path.name != entry_name(self.namespace, entry.partition, token_ids, images):
                raise ValueError("its name does not match its contents")
            return entry
        except FileNotFoundError:
            return None
        except Exception as error:  # any unreadable file: skipped, never served
            self._reject(path, f"unreadable header ({error})")
            return None

    # -- loading -----------------------------------------------------------------------------

    def load(self, entry: DiskEntry) -> list[LayerArrays] | None:
        """The entry's layers, after checking its checksum; None (and the file gone) if it fails."""
        from safetensors import safe_open

        try:
            # One open: the metadata and the tensors from the same read of the header.
            with safe_open(str(entry.path), framework="numpy") as handle:
                meta = handle.metadata() or {}
                tensors = {name: handle.get_tensor(name) for name in handle.keys()}  # noqa: SIM118
            if _checksum(tensors) != meta.get("sha256"):
                raise ValueError("checksum mismatch")
            layers = _unflatten(tensors, int(meta["layers"]))
        except FileNotFoundError:
            self._forget(entry.path.name)
            return None
        except Exception as error:
            self._reject(entry.path, f"not served ({error})")
            return None
        with contextlib.suppress(OSError):
            os.utime(entry.path)  # least recently used goes first
        return layers

    # -- writing -----------------------------------------------------------------------------

    def put(
        self,
        partition: str,
        token_ids: np.ndarray,
        images: PromptImages,
        layers: Sequence[LayerArrays],
        dtypes: dict[str, str] | None = None,
    ) -> None:
        """Queue one entry for writing (the writer thread does the disk work)."""
        if not self.enabled:
            return
        ids = np.ascontiguousarray(token_ids, dtype=np.int64)
        name = entry_name(self.namespace, partition, ids, images)
        if name in self:
            return
        tensors = _flatten(layers)
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
            "sha256": _checksum(tensors),
        }
        entry = DiskEntry(self.folder / name, partition, ids, dict(images), nbytes, dict(dtypes or {}))
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


def _flatten(layers: Sequence[LayerArrays]) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    for i, (keys, values) in enumerate(layers):
        for kind, parts in (("k", keys), ("v", values)):
            for j, part in enumerate(parts):
                tensors[f"{i}.{kind}.{j}"] = np.ascontiguousarray(part)
    return tensors


def _unflatten(tensors: dict[str, np.ndarray], count: int) -> list[LayerArrays]:
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


def _checksum(tensors: dict[str, np.ndarray]) -> str:
    digest = hashlib.sha256()
    for name in sorted(tensors):
        array = np.ascontiguousarray(tensors[name])
        digest.update(f"{name}:{array.dtype.str}:{array.shape}".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


def _images_json(images: PromptImages) -> str:
    return json.dumps({str(k): [v[0], v[1]] for k, v in sorted(images.items())}, separators=(",", ":"))


def _mtime(path: Path) -> float:
    try:
        return path.stat().st_mtime
    except OSError:
        return 0.0
