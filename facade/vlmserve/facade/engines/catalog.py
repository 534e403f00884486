"""A model as its engines describe it (cached for a short while); one catalog per model pool
(engines/pools.py)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from vlmserve.client import AsyncEngineClient
from vlmserve.common.images import ImageLimits
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.settings import Limits


class ModelCatalog:
    def __init__(self, engine: AsyncEngineClient, *, ttl_s: float, timeout_s: float) -> None:
        self._engine = engine
        self._ttl_s = ttl_s
        self._timeout_s = timeout_s
        self._info: pb.GetModelInfoResponse | None = None
        self._fetched_at = 0.0
        self._lock = asyncio.Lock()

    async def info(self) -> pb.GetModelInfoResponse:
        """The engine's model info; raises EngineError when the engine cannot be asked."""
        if self._info is not None and time.monotonic() - self._fetched_at < self._ttl_s:
            return self._info
        async with self._lock:
            if self._info is None or time.monotonic() - self._fetched_at >= self._ttl_s:
                self._info = await self._engine.model_info(timeout=self._timeout_s)
                self._fetched_at = time.monotonic()
            return self._info

    def cached(self) -> pb.GetModelInfoResponse | None:
        return self._info

    def forget(self) -> None:
        """The next `info()` asks the engine (it said it no longer serves what we cached)."""
        self._info = None


def image_limits(info: pb.GetModelInfoResponse, limits: Limits | None = None) -> ImageLimits:
    """Bounds per image, applied by the translation before any bytes are sent: the facade's own
    (`limits`) and the engine's, whichever is smaller."""
    own = limits or Limits()
    engine = info.image_limits
    return ImageLimits(
        max_bytes=min(own.max_image_bytes, engine.max_image_bytes or own.max_image_bytes),
        max_pixels=min(own.max_image_pixels, engine.max_image_pixels or own.max_image_pixels),
    )


def images_per_request(info: pb.GetModelInfoResponse, limits: Limits) -> int:
    """How many images one request may carry: the facade's limit and the engine's, the smaller."""
    engine = info.image_limits.max_images_per_request
    return min(limits.max_images_per_request, engine or limits.max_images_per_request)


def model_object(
    model_id: str,
    info: pb.GetModelInfoResponse | None,
    *,
    aliases: Sequence[str] = (),
    available: bool = True,
) -> dict[str, Any]:
    """An OpenAI `model` object, with what the engine says about it under `vlmserve`; `status`
    "unavailable" while its engines do not serve (with what they said last, if anything)."""
    status = "available" if available and info is not None else "unavailable"
    if info is None:
        return {
            "id": model_id,
            "object": "model",
            "created": 0,
            "owned_by": "vlmserve",
            "vlmserve": {"aliases": list(aliases), "status": status},
        }
    return {
        "id": model_id,
        "object": "model",
        "created": int(info.loaded_at),
        "owned_by": "vlmserve",
        "vlmserve": {
            "aliases": list(aliases),
            "status": status,
            # The engine's own name for it (its directory or hub id).
            "engine_model": info.model_id,
            "architecture": info.architecture,
            "context_length": info.context_length,
            "max_output_tokens": info.max_output_tokens,
            "input_modalities": [
                pb.Modality.Name(m).removeprefix("MODALITY_").lower() for m in info.input_modalities
            ],
            "tool_call_format": info.tool_call_format,
            "thinking": info.thinking,
            "weights": pb.WeightsState.Name(info.weights).removeprefix("WEIGHTS_STATE_").lower(),
        },
    }
