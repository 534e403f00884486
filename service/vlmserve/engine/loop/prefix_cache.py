"""KV caches of finished requests, reused by later prompts that start the same way.

Agents resend the same long prefix (system prompt, tool schemas, history with its screenshots)
every turn; on a CPU its prefill costs far more than the new turn. Each finished request leaves
its KV cache here with the token ids it covers and where its images sit (by content hash). A new
prompt takes the longest shared prefix among the entries *of its own partition* (the facade
sends a hash of the caller's API key): a prefix never serves another tenant, so neither
`cached_tokens` nor time to first token can tell one tenant anything about another's prompts.

Image tokens match only when the same image (content hash) sits at the same place: the
placeholder ids alone are identical for every image. With equal tokens and images before it,
a position's KV is the same in both prompts, M-RoPE positions included (they depend only on
what comes before). Entries are evicted least recently used first, to stay under `max_bytes`;
with a disk tier (`prefix_disk.py`) an evicted entry is written there first, every entry is
written there at shutdown, and a prompt whose longest match is on disk loads it back (a
restart, or another engine process of the same model sharing the folder, loses nothing).
Taking an entry shares its arrays (MLX arrays are immutable; the taker's cache grows into new
buffers), so several requests can start from one entry at once.

Some layers keep a state no prefix can be cut from: the recurrent layers of hybrid models
(Qwen3.5/3.6: Gated DeltaNet beside full attention), sliding-window layers (Gemma 3/4: a rotating
cache), chunked ones (Llama 4). Such a model's entries keep the plain KV layers like any other
entry, and the other layers' state (kv/snapshots.py) at a few boundaries an agent's next turn
shares (`checkpoints`): the end of the prompt and the end of the generated turn (the next turn
resends the conversation so far; where the template renders the model's answer differently, the
prompt's end still matches), and those of the entries a new one extends (at most
`MAX_CHECKPOINTS`, the latest). A prompt takes the longest boundary its shared prefix reaches, the
plain layers cut to the same position: exactly the state a fresh prefill reaches there. The disk
tier keeps such entries too, their boundary states included (kv/snapshot_codec.py): they come
back into a fresh cache of the model (`new_cache`).

Generation thread only.
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, cast

import numpy as np

from vlmserve.engine.kv.layout import KVLayout, KVPart, PromptCache
from vlmserve.engine.kv.sizing import kv_nbytes
from vlmserve.engine.kv.snapshots import BoundaryState, boundary_nbytes, cuttable, with_boundary_state
from vlmserve.engine.kv.views import layer_arrays, views
from vlmserve.engine.loop.prefix_disk import DiskEntry, LayerArrays, PrefixDiskTier
from vlmserve.engine.loop.prefix_disk_arrays import from_numpy, states_from_disk, states_to_disk, to_numpy

if TYPE_CHECKING:
    pass

__all__ = ["MAX_CHECKPOINTS", "PrefixCache", "PromptImages", "prompt_images", "shared_prefix_length"]

# Recurrent-state boundaries kept per hybrid entry (each one is every recurrent layer's state:
# a fixed size, ~2 MiB a layer on a real Qwen3.6, see docs/performance.md).
MAX_CHECKPOINTS = 4


class _Span(Protocol):
    @property
    def start(self) -> int: ...
    @property
    def length(self) -> int: ...
    @property
    def content_hash(self) -> str: ...


@dataclass
class _Entry:
    partition: str
    token_ids: np.ndarray
    images: PromptImages
    # per layer (keys, values), exactly len(token_ids) long (None: a layer kept in `checkpoints`)
    layers: Sequence[tuple[KVPart, KVPart] | None]
    nbytes: int
    from_disk: bool = False  # loaded from the disk tier and not yet taken (counts a disk hit)
    on_disk: bool = False  # the disk tier has it already: evicting it writes nothing
    # Layers no prefix can be cut from (recurrent, sliding-window, chunked: kv/snapshots.py): their
    # state at these positions, the only places such an entry can be cut.
    checkpoints: dict[int, BoundaryState] | None = None

    def usable(self, shared: int, prompt_tokens: int) -> int:
        return _usable(self.checkpoints, shared, prompt_tokens)


def _usable(checkpoints: Collection[int] | None, shared: int, prompt_tokens: int) -> int:
    """How many of a prompt's first tokens an entry serves when they share `shared` with it (one
    prompt token must still run, for the first new token's logits): any, or, for an entry kept
    at boundaries (`checkpoints`), the last boundary that far."""
    reach = min(shared, prompt_tokens - 1)
    if checkpoints is not None:
        return max((at for at in checkpoints if at <= reach), default=0)
    return reach


PromptImages = dict[int, tuple[int, str]]  # start -> (length, content hash)


def prompt_images(spans: Sequence[_Span]) -> PromptImages:
    return {span.start: (span.length, span.content_hash) for span in spans}


def shared_prefix_length(
    ids: np.ndarray, images: PromptImages, other_ids: np.ndarray, other_images: PromptImages
) -> int:
    """How many first tokens two prompts share: equal token ids, and at every image placeholder
    run before that point the same image (content hash) in both."""
    limit = min(ids.size, other_ids.size)
    mismatches = np.flatnonzero(ids[:limit] != other_ids[:limit])
    shared = int(mismatches[0]) if mismatches.size else limit
    for start in sorted({*images, *other_images}):
        if start < shared and images.get(start) != other_images.get(start):
            shared = start  # same placeholder ids, a different image (or a different layout)
            break
    return shared


class PrefixCache:
    def __init__(
        self,
        *,
        min_tokens: int,
        max_bytes: int,
        disk: PrefixDiskTier | None = None,
        layout: KVLayout | None = None,
        new_cache: Callable[[], PromptCache] | None = None,
    ) -> None:
        self.min_tokens = min_tokens
        # A fresh cache of the model: what boundary states from the disk tier are restored into
        # (None: such entries are neither written nor read).
        self.new_cache = new_cache
        self.max_bytes = max_bytes
        self.disk = disk
        # The KV's precision (kv/layout.py): entries keep the layout the batch has.
        self.layout = layout or KVLayout()
        self.bytes = 0
        # Hits by tier (metrics, tests).
        self.hits = {"memory": 0, "disk": 0}
        self._entries: collections.OrderedDict[int, _Entry] = collections.OrderedDict()
        self._next_key = 0

    @property
    def enabled(self) -> bool:
        return self.min_tokens > 0 and self.max_bytes > 0

    def __len__(self) -> int:
        return len(self._entries)

    def store(
        self,
        partition: str,
        token_ids: Sequence[int],
        spans: Sequence[_Span],
        cache: PromptCache,
        *,
        checkpoints: dict[int, BoundaryState] | None = None,
    ) -> None:
        """Keep `cache` (one row per layer, holding exactly `token_ids`) for `partition`. Its layers
        that are not plain KV (recurrent, sliding-window, chunked) are kept only as `checkpoints`
        (position -> kv/snapshots.py state; the end of the turn is one when the cache holds
        exactly `token_ids`)."""
        if not self.enabled or len(token_ids) < self.min_tokens or not cache:
            return
        n = len(token_ids)
        ids = np.asarray(token_ids, dtype=np.int64)
        if not all(cuttable(layer) for layer in cache):
            self._store_checkpointed(partition, ids, spans, cache, checkpoints or {})
            return
        if any(getattr(layer, "offset", -1) != n for layer in cache):
            return  # not the per-layer KV layout this relies on
        pairs = [layer_arrays(layer, n) for layer in cache]
        layers = [pair for pair in pairs if pair is not None]
        if len(layers) != len(pairs):
            return
        nbytes = sum(kv_nbytes(k) + kv_nbytes(v) for k, v in layers)
        if nbytes > self.max_bytes:
            return
        self._keep(_Entry(partition, ids, prompt_images(spans), layers, nbytes))

    def _store_checkpointed(
        self,
        partition: str,
        ids: np.ndarray,
        spans: Sequence[_Span],
        cache: PromptCache,
        checkpoints: dict[int, BoundaryState],
    ) -> None:
        n = ids.size
        layers: list[tuple[KVPart, KVPart] | None] = []
        for layer in cache:
            if not cuttable(layer):
                layers.append(None)  # only its checkpoints
                continue
            if (pair := layer_arrays(layer, n)) is None:
                return  # shorter than the tokens it should hold
            layers.append(pair)
        kept = {at: state for at, state in checkpoints.items() if self.min_tokens <= at <= n}
        if not kept:
            return
        on_disk = self.new_cache is None  # no way to read it back: never written
        entry = _Entry(partition, ids, prompt_images(spans), layers, 0, on_disk=on_disk, checkpoints=kept)
        entry.nbytes = _entry_nbytes(entry)
        if entry.nbytes <= self.max_bytes:
            self._keep(entry)

    def _keep(self, entry: _Entry) -> None:
        # An entry this one extends is redundant now; a checkpointed one's boundaries move to it.
        # A checkpointed entry is served only up to its last boundary, so one this entry extends
        # that far is redundant too (the next turn of a template that renders the answer
        # otherwise than generated parts from the previous entry after its last boundary).
        for key, old in list(self._entries.items()):
            if old.partition == entry.partition and _shared_length(
                old, entry.token_ids, entry.images
            ) >= _served_length(old):
                if entry.checkpoints is not None and old.checkpoints is not None:
                    merged = {**old.checkpoints, **entry.checkpoints}
                    entry.checkpoints = {at: merged[at] for at in sorted(merged)[-MAX_CHECKPOINTS:]}
                    entry.nbytes = _entry_nbytes(entry)
                elif (entry.checkpoints is None) != (old.checkpoints is None):
                    continue
                self._drop(key)
        self._entries[self._next_key] = entry
        self._next_key += 1
        self.bytes += entry.nbytes
        while self.bytes > self.max_bytes and len(self._entries) > 1:
            self._drop(next(iter(self._entries)), spill=True)

    def take(
        self, partition: str, prompt_ids: Sequence[int], spans: Sequence[_Span]
    ) -> tuple[PromptCache, int] | None:
        """(a KV cache holding the first n prompt tokens, n) for the longest same-partition match."""
        if not self.enabled or not (self._entries or (self.disk is not None and self.disk.enabled)):
            return None
        ids = np.asarray(prompt_ids, dtype=np.int64)
        images = prompt_images(spans)
        best_key, best = None, 0
        for key, entry in self._entries.items():
            if entry.partition != partition:
                continue
            usable = entry.usable(_shared_length(entry, ids, images), ids.size)
            if usable > best:
                best_key, best = key, usable
        if (loaded := self._take_from_disk(partition, ids, images, best)) is not None:
            best_key, best = loaded
        # At least one prompt token must still run, to get logits for the first new token.
        best = min(best, ids.size - 1)
        if best_key is None or best < self.min_tokens:
            return None
        self._entries.move_to_end(best_key)
        self.hits["disk" if self._entries[best_key].from_disk else "memory"] += 1
        entry = self._entries[best_key]
        entry.from_disk = False
        if entry.checkpoints is not None:
            cut = [None if pair is None else views([pair], best, self.layout)[0] for pair in entry.layers]
            return with_boundary_state(cut, entry.checkpoints[best]), best
        return views(cast(Sequence[tuple[KVPart, KVPart]], entry.layers), best, self.layout), best

    def _take_from_disk(
        self, partition: str, ids: np.ndarray, images: PromptImages, in_memory: int
    ) -> tuple[int, int] | None:
        """(key, tokens served) of a disk entry loaded into memory, when it beats `in_memory`."""
        if self.disk is None or not self.disk.enabled:
            return None
        best, served = None, max(in_memory, self.min_tokens - 1)
        for candidate in self.disk.entries(partition):
            if candidate.checkpoints and self.new_cache is None:
                continue
            length = shared_prefix_length(candidate.token_ids, candidate.images, ids, images)
            usable = _usable(candidate.checkpoints or None, length, ids.size)
            if usable > served:
                best, served = candidate, usable
        if best is None or (entry := self._entry_from_disk(partition, best)) is None:
            return None
        if entry.nbytes > self.max_bytes:
            return None
        self._keep(entry)
        return next(reversed(self._entries)), served

    def _entry_from_disk(self, partition: str, found: DiskEntry) -> _Entry | None:
        if (loaded := self.disk.load(found) if self.disk is not None else None) is None:
            return None
        layers = [
            None
            if pair is None
            else (from_numpy(pair[0], found.dtypes, "k"), from_numpy(pair[1], found.dtypes, "v"))
            for pair in loaded.layers
        ]
        entry = _Entry(partition, found.token_ids, found.images, layers, 0, from_disk=True, on_disk=True)
        if loaded.snapshots is not None:
            assert self.new_cache is not None, "checkpointed entries are read with a cache to restore into"
            try:
                entry.checkpoints = states_from_disk(loaded.snapshots, self.new_cache())
            except (ValueError, KeyError, TypeError) as error:
                assert self.disk is not None
                self.disk.reject(found, f"boundary states do not fit the model ({error})")
                return None
        entry.nbytes = _entry_nbytes(entry)
        return entry

    def _drop(self, key: int, *, spill: bool = False) -> None:
        entry = self._entries.pop(key)
        self.bytes -= entry.nbytes
        if spill:
            self._spill(entry)

    def _spill(self, entry: _Entry) -> None:
        if self.disk is None or not self.disk.enabled or entry.on_disk:
            return
        arrays: list[LayerArrays | None] = []
        dtypes: dict[str, str] = {}
        for layer in entry.layers:
            if layer is None:  # kept only at the boundaries
                arrays.append(None)
                continue
            keys, values = layer
            pair = []
            for kind, part in (("k", keys), ("v", values)):
                numpy_parts = []
                for index, array in enumerate(part if isinstance(part, tuple) else (part,)):
                    data, dtype = to_numpy(array)
                    dtypes.setdefault(f"{kind}.{index}", dtype)
                    numpy_parts.append(data)
                pair.append(tuple(numpy_parts))
            arrays.append((pair[0], pair[1]))
        snapshots = states_to_disk(entry.checkpoints) if entry.checkpoints is not None else None
        self.disk.put(entry.partition, entry.token_ids, entry.images, arrays, dtypes, snapshots)
        entry.on_disk = True

    def persist(self) -> None:
        """Write every entry to the disk tier and wait for it (shutdown)."""
        if self.disk is None:
            return
        for entry in self._entries.values():
            self._spill(entry)
        self.disk.flush()
        self.disk.close()

    def release_memory(self) -> None:
        """Free the entries held in memory (the model's idle unload); with a disk tier they are
        written there first, so the next load finds them."""
        if self.disk is not None and self.disk.enabled:
            for entry in self._entries.values():
                self._spill(entry)
            self.disk.flush()
        self.clear()

    def clear(self) -> None:
        self._entries.clear()
        self.bytes = 0


def _entry_nbytes(entry: _Entry) -> int:
    attention = sum(
        kv_nbytes(k) + kv_nbytes(v) for pair in entry.layers if pair is not None for k, v in [pair]
    )
    return attention + sum(boundary_nbytes(state) for state in (entry.checkpoints or {}).values())


def _served_length(entry: _Entry) -> int:
    """The most first tokens the entry can ever serve: all of them, or its last boundary."""
    return max(entry.checkpoints) if entry.checkpoints else entry.token_ids.size


def _shared_length(entry: _Entry, ids: np.ndarray, images: PromptImages) -> int:
    return shared_prefix_length(entry.token_ids, entry.images, ids, images)
