"""Computer actions in two shapes, and the conversions between them. No MLX.

* The contract's (a TOOL_KIND_COMPUTER call's `arguments`): one action in the Responses shape,
  coordinates in screen pixels: `{"type": "click", "button": "left", "x": 10, "y": 20}`, `drag`
  with a `path`, `scroll` with `scroll_x`/`scroll_y`, `type`, `keypress`, `move`, `wait`,
  `screenshot`, `double_click` (docs/computer-use.md).
* The model's: the `computer` function of the Qwen-VL computer-use cookbook that these models are
  trained on — `{"action": "left_click", "coordinate": [x, y]}`, `key` with `keys`, ... — in the
  family's coordinate convention (`conventions.py`).

`model_schema` is the function's JSON Schema: one branch per action with every field required
and nothing else allowed, coordinates bounded to the model's range for the current screenshot,
so a grammar built from it admits only actions that parse and land on the screen.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

from vlmserve.engine.computer.conventions import Space

__all__ = [
    "BUTTON_ACTIONS",
    "ActionError",
    "model_schema",
    "to_contract",
    "to_model",
]

# Responses click button <-> the model's click action.
BUTTON_ACTIONS: dict[str, str] = {
    "left": "left_click",
    "right": "right_click",
    "wheel": "middle_click",
    "back": "back_click",
    "forward": "forward_click",
}
_BUTTONS = {action: button for button, action in BUTTON_ACTIONS.items()}
_POINTER_ACTIONS = (*BUTTON_ACTIONS.values(), "double_click", "mouse_move")
MAX_DRAG_POINTS = 64


class ActionError(ValueError):
    """An action that is not one of the known ones, or not well formed; `field` names where."""

    def __init__(self, message: str, field: str = "") -> None:
        super().__init__(message)
        self.field = field


def _coordinate(space: Space) -> dict[str, Any]:
    """[x, y], each within the model's range for this screen (the relative scale's 1000 is the
    far edge; `Space.to_screen` clamps it onto the last pixel)."""
    high_x = space.model_width if space.model_width == 1000 else space.model_width - 1
    high_y = space.model_height if space.model_height == 1000 else space.model_height - 1
    pair: dict[str, Any] = {"type": "array", "minItems": 2, "maxItems": 2}
    if high_x == high_y:
        return {**pair, "items": {"type": "integer", "minimum": 0, "maximum": high_x}}
    return {
        **pair,
        "prefixItems": [
            {"type": "integer", "minimum": 0, "maximum": high_x},
            {"type": "integer", "minimum": 0, "maximum": high_y},
        ],
        "items": False,
    }


def _branch(action: str | tuple[str, ...], fields: Mapping[str, Any]) -> dict[str, Any]:
    name: dict[str, Any] = {"const": action} if isinstance(action, str) else {"enum": list(action)}
    return {
        "properties": {"action": name, **fields},
        "required": ["action", *fields],
        "additionalProperties": False,
    }


_POINT = {"$ref": "#/$defs/point"}


def model_schema(space: Space | None) -> dict[str, Any]:
    """The `computer` function's parameters: one branch per argument shape, every field
    required, nothing else allowed. Kept short (it is in every prompt). Without a screen (no
    screenshot yet, no display size) only the actions that need no coordinates are offered."""
    branches = [
        _branch(("screenshot", "wait"), {}),
        _branch("type", {"text": {"type": "string"}}),
        _branch("key", {"keys": {"type": "array", "items": {"type": "string"}, "minItems": 1}}),
    ]
    if space is None:
        return {"type": "object", "anyOf": branches}
    branches += [
        _branch(_POINTER_ACTIONS, {"coordinate": _POINT}),
        _branch(
            "scroll", {"coordinate": _POINT, "scroll_x": {"type": "integer"}, "scroll_y": {"type": "integer"}}
        ),
        _branch(
            "left_click_drag",
            {"path": {"type": "array", "items": _POINT, "minItems": 2, "maxItems": MAX_DRAG_POINTS}},
        ),
    ]
    return {"type": "object", "anyOf": branches, "$defs": {"point": _coordinate(space)}}


# -- contract -> model (a replayed call) ---------------------------------------------------------


def _int(action: Mapping[str, Any], name: str) -> int:
    value = action.get(name)
    if isinstance(value, bool) or not isinstance(value, int):
        raise ActionError(f"'{name}' must be an integer", field=name)
    return value


def _point(action: Mapping[str, Any], space: Space | None, prefix: str = "") -> list[int]:
    x, y = _int(action, "x"), _int(action, "y")
    if space is None:
        raise ActionError("a pointer action needs a screen: send a screenshot first", field=f"{prefix}x")
    if not space.on_screen(x, y):
        raise ActionError(
            f"({x}, {y}) is outside the {space.width}x{space.height} screen", field=f"{prefix}x"
        )
    return list(space.to_model(x, y))


def _strings(value: object, name: str) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        raise ActionError(f"'{name}' must be a list of strings", field=name)
    return list(value)


def to_model(action: Mapping[str, Any], space: Space | None) -> dict[str, Any]:
    """A contract action -> the model's, for rendering a replayed call. Raises ActionError."""
    kind = action.get("type")
    if kind == "screenshot":
        return {"action": "screenshot"}
    if kind == "wait":
        return {"action": "wait"}
    if kind == "type":
        text = action.get("text")
        if not isinstance(text, str):
            raise ActionError("'text' must be a string", field="text")
        return {"action": "type", "text": text}
    if kind == "keypress":
        return {"action": "key", "keys": _strings(action.get("keys"), "keys")}
    if kind == "click":
        button = action.get("button", "left")
        if button not in BUTTON_ACTIONS:
            raise ActionError(f"unknown button {button!r}", field="button")
        return {"action": BUTTON_ACTIONS[str(button)], "coordinate": _point(action, space)}
    if kind == "double_click":
        return {"action": "double_click", "coordinate": _point(action, space)}
    if kind == "move":
        return {"action": "mouse_move", "coordinate": _point(action, space)}
    if kind == "scroll":
        return {
            "action": "scroll",
            "coordinate": _point(action, space),
            "scroll_x": _int(action, "scroll_x"),
            "scroll_y": _int(action, "scroll_y"),
        }
    if kind == "drag":
        path = action.get("path")
        if not isinstance(path, list) or len(path) < 2:
            raise ActionError("'path' must list at least two points", field="path")
        points = []
        for index, point in enumerate(path):
            if not isinstance(point, Mapping):
                raise ActionError("a path point must be an object with x and y", field=f"path[{index}]")
            points.append(_point(point, space, prefix=f"path[{index}]."))
        return {"action": "left_click_drag", "path": points}
    raise ActionError(f"unknown computer action type {kind!r}", field="type")


# -- model -> contract (a generated call) ---------------------------------------------------------


def _screen_point(value: object, space: Space | None) -> dict[str, int]:
    if space is None or not isinstance(value, list) or len(value) != 2:
        raise ActionError("a coordinate must be [x, y] on a known screen", field="coordinate")
    x, y = value
    if not isinstance(x, int) or not isinstance(y, int):
        raise ActionError("coordinates must be integers", field="coordinate")
    screen_x, screen_y = space.to_screen(x, y)
    return {"x": screen_x, "y": screen_y}


def _click(button: str) -> Callable[[Mapping[str, Any], Space | None], dict[str, Any]]:
    return lambda action, space: {
        "type": "click",
        "button": button,
        **_screen_point(action["coordinate"], space),
    }


_FROM_MODEL: dict[str, Callable[[Mapping[str, Any], Space | None], dict[str, Any]]] = {
    **{name: _click(button) for name, button in _BUTTONS.items()},
    "screenshot": lambda action, space: {"type": "screenshot"},
    "wait": lambda action, space: {"type": "wait"},
    "type": lambda action, space: {"type": "type", "text": str(action.get("text", ""))},
    "key": lambda action, space: {"type": "keypress", "keys": _strings(action.get("keys"), "keys")},
    "double_click": lambda action, space: {
        "type": "double_click",
        **_screen_point(action["coordinate"], space),
    },
    "mouse_move": lambda action, space: {"type": "move", **_screen_point(action["coordinate"], space)},
    "scroll": lambda action, space: {
        "type": "scroll",
        **_screen_point(action["coordinate"], space),
        "scroll_x": int(action.get("scroll_x", 0)),
        "scroll_y": int(action.get("scroll_y", 0)),
    },
    "left_click_drag": lambda action, space: {
        "type": "drag",
        "path": [_screen_point(point, space) for point in action.get("path", [])],
    },
}


def to_contract(arguments: str, space: Space | None) -> dict[str, Any]:
    """The model's call arguments -> a contract action in screen pixels. Raises ActionError
    (only for output the grammar did not hold: a request without one)."""
    try:
        action = json.loads(arguments)
    except ValueError:
        raise ActionError("the model's computer action is not JSON") from None
    if not isinstance(action, dict):
        raise ActionError("the model's computer action is not an object")
    convert = _FROM_MODEL.get(str(action.get("action")))
    if convert is None:
        raise ActionError(f"the model wrote an unknown computer action {action.get('action')!r}")
    try:
        return convert(action, space)
    except (KeyError, TypeError, ValueError) as error:
        raise ActionError(f"the model's {action['action']} action is malformed: {error}") from None
