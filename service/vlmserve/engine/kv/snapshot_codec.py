"""A boundary state (snapshots.py) as named arrays and a plain description, and back: what the
prefix cache's disk tier writes for layers no prefix can be cut from (recurrent, sliding-window,
chunked), so a restarted engine restores them exactly.

No class is ever built from a name in a file: a state comes back only into copies of the layers
of a fresh cache of the same model (`templates`, what `new_prompt_cache` makes), and only when
the description names each such layer's class and all its attributes: arrays (or lists and
tuples of arrays, a recurrent layer's conv window and state) and plain values (offsets, window
sizes; a plain value a model added to the live layer too, but no name of the class's own).
Anything else is refused (ValueError), never served.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from vlmserve.engine.kv.layout import CacheLayer
from vlmserve.engine.kv.snapshots import BoundaryState, cuttable

if TYPE_CHECKING:
    import mlx.core as mx

__all__ = ["StateLayout", "state_arrays", "state_from_arrays"]

# Per kept layer (by its index, as a string: JSON keys): its class name, plain values, array
# attributes, and list/tuple attributes (kind and which items are present).
StateLayout = dict[str, dict[str, Any]]
_PLAIN = (int, float, str, bool, type(None))


def state_arrays(state: BoundaryState) -> tuple[dict[str, mx.array], StateLayout]:
    """The state's arrays by name (`layer.attribute` or `layer.attribute.item`) and its layout."""
    import mlx.core as mx

    arrays: dict[str, mx.array] = {}
    layout: StateLayout = {}
    for index, layer in enumerate(state):
        if layer is None:
            continue
        values: dict[str, Any] = {}
        named: list[str] = []
        sequences: dict[str, dict[str, Any]] = {}
        for name, value in vars(layer).items():
            if isinstance(value, mx.array):
                arrays[f"{index}.{name}"] = value
                named.append(name)
            elif isinstance(value, list | tuple):
                present = []
                for item_index, item in enumerate(value):
                    if item is not None:
                        arrays[f"{index}.{name}.{item_index}"] = item
                    present.append(item is not None)
                sequences[name] = {"kind": type(value).__name__, "present": present}
            else:
                values[name] = value
        layout[str(index)] = {
            "type": type(layer).__name__,
            "values": values,
            "arrays": named,
            "sequences": sequences,
        }
    return arrays, layout


def state_from_arrays(
    layout: Mapping[str, Any], arrays: Mapping[str, mx.array], templates: Sequence[CacheLayer]
) -> BoundaryState:
    """The state `state_arrays` described, in copies of `templates` (a fresh cache of the same
    model); ValueError when it does not fit them."""
    used: set[str] = set()
    state: BoundaryState = []
    for index, template in enumerate(templates):
        described = layout.get(str(index))
        if described is None:
            if not cuttable(template):
                raise ValueError(f"layer {index} ({type(template).__name__}) has no state")
            state.append(None)
            continue
        state.append(_layer(index, described, arrays, template, used))
    if set(layout) - {str(index) for index in range(len(templates))}:
        raise ValueError("states for layers the model does not have")
    if set(arrays) - used:
        raise ValueError("arrays no layer names")
    return state


def _layer(
    index: int, described: Any, arrays: Mapping[str, mx.array], template: CacheLayer, used: set[str]
) -> CacheLayer:
    if not isinstance(described, dict) or described.get("type") != type(template).__name__:
        raise ValueError(f"layer {index} is not a {type(template).__name__}")
    values, named, sequences = described.get("values"), described.get("arrays"), described.get("sequences")
    if not (isinstance(values, dict) and isinstance(named, list) and isinstance(sequences, dict)):
        raise ValueError(f"layer {index}: malformed description")
    described_names = [*values, *named, *sequences]
    missing = set(vars(template)) - set(described_names)
    # A model may add plain values to a live layer (Qwen3.5 notes its metadata revision there):
    # those may come back, never an array, nor a name the class itself has (a method).
    extra = set(described_names) - set(vars(template))
    if missing or len(set(described_names)) != len(described_names):
        raise ValueError(
            f"layer {index}: not the attributes of a {type(template).__name__} {sorted(missing)}"
        )
    if any(name not in values or name.startswith("__") or hasattr(type(template), name) for name in extra):
        raise ValueError(f"layer {index}: attributes a {type(template).__name__} does not have")
    layer = copy.copy(template)
    for name, value in values.items():
        if not isinstance(value, _PLAIN):
            raise ValueError(f"layer {index}.{name}: not a plain value")
        setattr(layer, name, value)
    for name in named:
        setattr(layer, name, _array(arrays, f"{index}.{name}", used))
    for name, sequence in sequences.items():
        kind, present = sequence.get("kind"), sequence.get("present")
        if kind not in ("list", "tuple") or not isinstance(present, list):
            raise ValueError(f"layer {index}.{name}: malformed sequence")
        items = [
            _array(arrays, f"{index}.{name}.{item}", used) if there else None
            for item, there in enumerate(present)
        ]
        setattr(layer, name, items if kind == "list" else tuple(items))
    return layer


def _array(arrays: Mapping[str, mx.array], name: str, used: set[str]) -> mx.array:
    if name not in arrays:
        raise ValueError(f"array {name} missing")
    used.add(name)
    return arrays[name]
