"""The `mx.distributed` group of a `--distributed` engine: joining it, loading this rank's share
of the model, and sending rank 0's bytes to every rank (distributed.py builds on these).

Below the generation loop: model.py loads through `sharded_model`, so nothing here imports the loop.
"""

from __future__ import annotations

import logging
from typing import Any

__all__ = ["broadcast", "rank", "sharded_model", "world"]

log = logging.getLogger(__name__)


def world() -> Any:
    """The `mx.distributed` group of all the processes `mlx.launch` started (any backend)."""
    import mlx.core as mx

    try:
        return mx.distributed.init(strict=True)
    except RuntimeError as error:
        raise RuntimeError(
            "--distributed needs the processes started by mlx.launch (or MLX_HOSTFILE and MLX_RANK "
            f"set for the ring backend): {error}"
        ) from error


def rank() -> int:
    return int(world().rank())


def sharded_model(source: str, distributed: str) -> tuple[Any, Any]:
    """mlx-vlm's `sharded_load`: this rank's share of the model, over the whole group."""
    from mlx_vlm.utils import sharded_load

    group = world()
    try:
        if distributed == "tensor":
            loaded: tuple[Any, Any] = sharded_load(source, tensor_group=group)
        else:
            loaded = sharded_load(source, pipeline_group=group)
    except ValueError as error:  # mlx-vlm's model has no `shard` / `pipeline`
        raise ValueError(f"{source} cannot be loaded with --distributed {distributed}: {error}") from error
    log.info("rank %d of %d holds its %s-parallel share", group.rank(), group.size(), distributed)
    return loaded


def broadcast(payload: bytes | None, group: Any) -> bytes:
    """Rank 0's `payload` on every rank (the others pass None), over the group's all_sum: the
    same channel as the model's own collectives, so it stays in step with them."""
    import mlx.core as mx
    import numpy as np

    mine = payload if payload is not None else b""
    size = mx.distributed.all_sum(mx.array([len(mine)], dtype=mx.int32), group=group, stream=mx.cpu)
    length = int(np.array(size)[0])
    if length == 0:
        return b""
    buffer = np.zeros(length, dtype=np.uint8) if payload is None else np.frombuffer(payload, dtype=np.uint8)
    summed = mx.distributed.all_sum(mx.array(buffer), group=group, stream=mx.cpu)
    return bytes(np.array(summed, copy=False))
