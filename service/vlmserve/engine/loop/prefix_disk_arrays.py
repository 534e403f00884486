"""The prefix cache's arrays as its disk tier keeps them (numpy; generation thread): KV parts,
and boundary states (kv/snapshots.py) as named arrays with the description
kv/snapshot_codec.py reads back. bfloat16, which numpy lacks, travels as its uint16 bit pattern,
named beside it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import numpy as np

from vlmserve.engine.kv.layout import KVPart, PromptCache
from vlmserve.engine.kv.snapshot_codec import state_arrays, state_from_arrays
from vlmserve.engine.kv.snapshots import BoundaryState
from vlmserve.engine.loop.prefix_disk_io import Snapshots

if TYPE_CHECKING:
    import mlx.core as mx

__all__ = ["from_numpy", "states_from_disk", "states_to_disk", "to_numpy"]


def to_numpy(array: mx.array) -> tuple[np.ndarray, str]:
    """An MLX array's data as numpy (bfloat16, which numpy lacks, as its uint16 bit pattern)."""
    import mlx.core as mx

    if array.dtype == mx.bfloat16:
        return np.asarray(array.view(mx.uint16)), "bfloat16"
    return np.asarray(array), ""


def from_numpy(parts: tuple[np.ndarray, ...], dtypes: dict[str, str], kind: str) -> KVPart:
    """Keys or values back in MLX: one array, or a quantized tuple (data, scales, biases)."""
    import mlx.core as mx

    arrays = []
    for index, data in enumerate(parts):
        array = mx.array(data)
        if dtypes.get(f"{kind}.{index}") == "bfloat16":
            array = array.view(mx.bfloat16)
        arrays.append(array)
    mx.eval(arrays)
    return arrays[0] if len(arrays) == 1 else tuple(arrays)


def states_to_disk(checkpoints: dict[int, BoundaryState]) -> Snapshots:
    """Boundary states as the disk tier keeps them: numpy arrays named `position.layer.attribute`
    (bfloat16 as its bit pattern, named in the description) and their layouts."""
    arrays: dict[str, np.ndarray] = {}
    layouts: dict[str, object] = {}
    bfloat16: list[str] = []
    for at, state in checkpoints.items():
        named, layout = state_arrays(state)
        for name, array in named.items():
            data, dtype = to_numpy(array)
            arrays[f"{at}.{name}"] = data
            if dtype:
                bfloat16.append(f"{at}.{name}")
        layouts[str(at)] = layout
    description = json.dumps({"layouts": layouts, "bfloat16": bfloat16}, separators=(",", ":"))
    return Snapshots(tuple(checkpoints), arrays, description)


def states_from_disk(snapshots: Snapshots, templates: PromptCache) -> dict[int, BoundaryState]:
    """`states_to_disk` read back into copies of `templates` (ValueError when they do not fit)."""
    import mlx.core as mx

    described = json.loads(snapshots.description)
    layouts, bfloat16 = described["layouts"], set(described["bfloat16"])
    if sorted(int(at) for at in layouts) != sorted(snapshots.positions):
        raise ValueError("boundaries without states")
    states: dict[int, BoundaryState] = {}
    for at in snapshots.positions:
        prefix = f"{at}."
        named = {}
        for name, data in snapshots.arrays.items():
            if name.startswith(prefix):
                array = mx.array(data)
                named[name.removeprefix(prefix)] = array.view(mx.bfloat16) if name in bfloat16 else array
        states[at] = state_from_arrays(layouts[str(at)], named, templates)
    if sum(len(state_arrays(state)[0]) for state in states.values()) != len(snapshots.arrays):
        raise ValueError("arrays no boundary names")
    mx.eval([array for state in states.values() for array in state_arrays(state)[0].values()])
    return states
