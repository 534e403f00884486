"""Reuse of the previous request's KV cache for a shared prompt prefix (generation thread only).

Agents resend the same long prefix (system prompt, tool schemas, history) every turn; on a CPU
its prefill costs far more than the new turn. One slot holds the KV cache of the most recently
finished request with the token ids it covers. A new request whose prompt starts with at least
`min_tokens` of the same ids takes the slot over (no copy), trimmed to the shared part, and
prefills only the rest; `Usage.cached_tokens` reports the reused count.

Only tokens before the first vision token are reused: up to there positions are plain
sequential ones in every request, whereas after an image Qwen2-VL's M-RoPE positions depend on
the image grid.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["PrefixCache", "vision_token_ids"]

_VISION_TOKEN_ATTRIBUTES = (
    "image_token_id",
    "image_token_index",
    "video_token_id",
    "video_token_index",
    "vision_start_token_id",
    "boi_token_index",
)


def vision_token_ids(model_config: Any) -> frozenset[int]:
    """Ids after which positions may stop being plain (image/video placeholders and markers)."""
    ids = set()
    for name in _VISION_TOKEN_ATTRIBUTES:
        value = getattr(model_config, name, None)
        if isinstance(value, int) and value >= 0:
            ids.add(value)
    return frozenset(ids)


def _plain_length(ids: np.ndarray, vision_ids: np.ndarray) -> int:
    """How many leading ids come before the first vision token."""
    hits = np.flatnonzero(np.isin(ids, vision_ids))
    return int(hits[0]) if hits.size else int(ids.size)


def _holds_prefix(layer: Any, shared: int) -> bool:
    """Whether a trimmed layer cache can continue at position `shared` as a fresh one would.

    A chunked-attention layer (Llama 4) attends within fixed blocks of `chunk_size` positions
    and keeps only its last `chunk_size` keys: it can trim back only while it still holds every
    key of the block that position `shared` falls in (it used to go on from the wrong keys).
    """
    if layer.offset != shared:
        return False
    chunk = getattr(layer, "chunk_size", None)
    start = getattr(layer, "start_position", 0)
    return not chunk or start <= shared - shared % chunk


@dataclass
class _Entry:
    token_ids: np.ndarray
    cache: list[Any]
    plain: int


class PrefixCache:
    def __init__(self, *, min_tokens: int, vision_ids: frozenset[int]) -> None:
        self.min_tokens = min_tokens
        self._vision_ids = np.array(sorted(vision_ids), dtype=np.int64)
        self._entry: _Entry | None = None

    def store(self, token_ids: Sequence[int], cache: list[Any]) -> None:
        """Keep `cache`, which holds exactly `token_ids`, for the next request."""
        if self.min_tokens <= 0 or not cache:
            return
        if not all(getattr(c, "is_trimmable", lambda: False)() for c in cache):
            return
        if any(getattr(c, "offset", -1) != len(token_ids) for c in cache):
            return  # not the plain per-layer KV layout this relies on
        ids = np.asarray(token_ids, dtype=np.int64)
        plain = _plain_length(ids, self._vision_ids)
        if plain < self.min_tokens:
            self._entry = None
            return
        self._entry = _Entry(token_ids=ids, cache=cache, plain=plain)

    def take(self, prompt_ids: Sequence[int]) -> tuple[list[Any], int] | None:
        """(cache holding the first n prompt tokens, n) when enough is shared; the slot is emptied."""
        entry = self._entry
        if entry is None:
            return None
        ids = np.asarray(prompt_ids, dtype=np.int64)
        # At least one prompt token must still be run, to get logits for the first new token.
        limit = min(entry.plain, _plain_length(ids, self._vision_ids), ids.size - 1)
        if limit < self.min_tokens:
            return None
        mismatches = np.flatnonzero(entry.token_ids[:limit] != ids[:limit])
        shared = int(mismatches[0]) if mismatches.size else limit
        if shared < self.min_tokens:
            return None
        self._entry = None
        for layer in entry.cache:
            layer.trim(layer.offset - shared)
        if not all(_holds_prefix(layer, shared) for layer in entry.cache):
            return None  # start fresh
        return entry.cache, shared

    def clear(self) -> None:
        self._entry = None
