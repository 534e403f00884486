"""The vision-feature cache's disk tier: an image's features outlive a restart, so an engine that
comes back does not run the vision tower again for a screenshot it has seen (an agent's history
resent with another prompt before it, where the prefix cache cannot help).

Each image's features are one file in the prefix cache's disk format (prefix_disk.py), in a
folder of their own (the namespace is the model's and says "vision"), so they get the same
safety: a file name that is a hash and reveals nothing, the partition (API key) in every match,
atomic writes by a writer thread, a SHA-256 checked on load, a damaged or foreign file skipped and
removed, the folder bounded in bytes (least recently used first), a full disk or a folder that
does not answer turning the tier off. An entry is the image's content hash as its one "image"
over a one-token placeholder, and its features as its one "layer" (keys: the feature arrays;
values: an empty array, which the format requires).

Generation thread (plus the tier's own threads).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from vlmserve.engine.loop.prefix_disk import PrefixDiskTier
from vlmserve.engine.loop.prefix_disk_arrays import from_numpy, to_numpy

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["VisionDiskTier"]

_PLACEHOLDER = np.zeros(1, dtype=np.int64)  # the one "token" an entry covers


class VisionDiskTier:
    def __init__(
        self,
        folder: Path,
        *,
        namespace: str,
        max_bytes: int,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self._tier = PrefixDiskTier(
            folder, namespace=f"vision-features\0{namespace}", max_bytes=max_bytes, on_error=on_error
        )
        self.hits = 0

    @property
    def enabled(self) -> bool:
        return self._tier.enabled

    def get(self, partition: str, content_hash: str) -> Any | None:
        """The image's features (MLX, as they were put), or None."""
        if not self._tier.enabled:
            return None
        found = next(
            (
                entry
                for entry in self._tier.entries(partition)
                if entry.images == {0: (1, content_hash)} and entry.token_ids.size == 1
            ),
            None,
        )
        if found is None or (loaded := self._tier.load(found)) is None:
            return None
        (layer,) = loaded.layers
        if layer is None:
            return None
        features = from_numpy(layer[0], found.dtypes, "k")
        if isinstance(features, tuple):
            return None  # not what put writes
        self.hits += 1
        return features

    def put(self, partition: str, content_hash: str, features: Any) -> None:
        """Queue the image's features (an MLX array) for writing."""
        if not self._tier.enabled:
            return
        data, dtype = to_numpy(features)
        layer = ((data,), (np.zeros(0, dtype=data.dtype),))
        self._tier.put(partition, _PLACEHOLDER, {0: (1, content_hash)}, [layer], {"k.0": dtype})

    def close(self) -> None:
        """Wait for the queued writes (shutdown)."""
        self._tier.flush()
        self._tier.close()
