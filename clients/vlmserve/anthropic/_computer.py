"""Anthropic's computer tool (`computer_20250124`, `computer_20251124`) on the Messages API
(docs/computer-use.md): offered as the Responses `computer_use_preview` tool with the tool's
display, its `tool_use` blocks (replayed and generated) translated between Anthropic's actions and
the Responses ones the contract carries. A `tool_result` holding the screenshot needs nothing
more: its image reaches the model as any tool result's does.

Actions with no Responses counterpart (`triple_click`, `hold_key`, `left_mouse_down`/`up`,
`cursor_position`, `zoom`) are never generated here, and a replayed one is a 400 naming it rather
than a call the model would see as something else.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

from pydantic import Field

from vlmserve.responses import InvalidRequestError, RequestModel

__all__ = [
    "COMPUTER_TOOL_TYPES",
    "ComputerToolParam",
    "from_responses_action",
    "responses_tool",
    "to_responses_action",
]

COMPUTER_TOOL_TYPES = ("computer_20250124", "computer_20251124")
_CLICKS = {"left_click": "left", "right_click": "right", "middle_click": "wheel"}
_BUTTONS = {button: action for action, button in _CLICKS.items()}
_UNREPRESENTABLE = ("triple_click", "hold_key", "left_mouse_down", "left_mouse_up", "cursor_position", "zoom")


class ComputerToolParam(RequestModel):
    type: Literal["computer_20250124", "computer_20251124"]
    name: Literal["computer"]
    display_width_px: int = Field(ge=1, le=65535)
    display_height_px: int = Field(ge=1, le=65535)
    display_number: int | None = None
    enable_zoom: bool | None = None


def responses_tool(tool: ComputerToolParam) -> dict[str, Any]:
    return {
        "type": "computer_use_preview",
        "display_width": tool.display_width_px,
        "display_height": tool.display_height_px,
        "environment": "linux",
    }


def _refuse(where: str, message: str) -> InvalidRequestError:
    return InvalidRequestError(f"Invalid value for '{where}': {message}", param=where)


def _point(value: object, where: str) -> dict[str, int]:
    if (
        not isinstance(value, list)
        or len(value) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in value)
    ):
        raise _refuse(where, "expected [x, y], two integers.")
    return {"x": value[0], "y": value[1]}


def _text(action: Mapping[str, Any], where: str) -> str:
    text = action.get("text")
    if not isinstance(text, str):
        raise _refuse(f"{where}.text", "expected a string.")
    return text


def to_responses_action(action: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A replayed `tool_use` input (at `where`) -> the Responses action."""
    name = action.get("action")
    at = f"{where}.action"
    if name in _CLICKS or name in ("double_click", "mouse_move"):
        point = _point(action.get("coordinate"), f"{where}.coordinate")
        kind = {"double_click": "double_click", "mouse_move": "move"}.get(str(name), "click")
        result: dict[str, Any] = {"type": kind, **point}
        if kind == "click":
            result["button"] = _CLICKS[str(name)]
        if isinstance(action.get("text"), str) and action["text"]:
            result["keys"] = action["text"].split("+")  # the modifier keys held
        return result
    if name == "left_click_drag":
        start = _point(action.get("start_coordinate"), f"{where}.start_coordinate")
        return {"type": "drag", "path": [start, _point(action.get("coordinate"), f"{where}.coordinate")]}
    if name == "scroll":
        point = _point(action.get("coordinate"), f"{where}.coordinate")
        amount = action.get("scroll_amount", 0)
        if not isinstance(amount, int) or isinstance(amount, bool):
            raise _refuse(f"{where}.scroll_amount", "expected an integer.")
        direction = action.get("scroll_direction")
        deltas = {"up": (0, -amount), "down": (0, amount), "left": (-amount, 0), "right": (amount, 0)}
        if direction not in deltas:
            raise _refuse(f"{where}.scroll_direction", "expected up, down, left or right.")
        scroll_x, scroll_y = deltas[str(direction)]
        return {"type": "scroll", **point, "scroll_x": scroll_x, "scroll_y": scroll_y}
    if name == "type":
        return {"type": "type", "text": _text(action, where)}
    if name == "key":
        return {"type": "keypress", "keys": _text(action, where).split("+")}
    if name in ("screenshot", "wait"):
        return {"type": str(name)}
    if name in _UNREPRESENTABLE:
        raise _refuse(at, f"'{name}' actions cannot be replayed on this server.")
    raise _refuse(at, "unknown computer action.")


def from_responses_action(action: Mapping[str, Any]) -> dict[str, Any]:
    """A generated Responses action -> the `tool_use` input Anthropic's computer tool defines."""
    kind = action.get("type")
    point = [action.get("x"), action.get("y")]
    if kind == "click":
        button = _BUTTONS.get(str(action.get("button")), "left_click")
        result: dict[str, Any] = {"action": button, "coordinate": point}
    elif kind == "double_click":
        result = {"action": "double_click", "coordinate": point}
    elif kind == "move":
        result = {"action": "mouse_move", "coordinate": point}
    elif kind == "drag":
        path = action.get("path") or []
        result = {
            "action": "left_click_drag",
            "start_coordinate": [path[0]["x"], path[0]["y"]],
            "coordinate": [path[-1]["x"], path[-1]["y"]],
        }
    elif kind == "scroll":
        scroll_x, scroll_y = int(action.get("scroll_x", 0)), int(action.get("scroll_y", 0))
        if abs(scroll_y) >= abs(scroll_x):
            direction, amount = ("down" if scroll_y >= 0 else "up"), abs(scroll_y)
        else:
            direction, amount = ("right" if scroll_x > 0 else "left"), abs(scroll_x)
        result = {"action": "scroll", "coordinate": point}
        result |= {"scroll_direction": direction, "scroll_amount": amount}
    elif kind == "type":
        result = {"action": "type", "text": action.get("text", "")}
    elif kind == "keypress":
        result = {"action": "key", "text": "+".join(action.get("keys") or [])}
    else:
        result = {"action": str(kind)}  # screenshot, wait
    keys = action.get("keys")
    if kind in ("click", "double_click") and keys:
        result["text"] = "+".join(keys)
    return result
