"""Computer use on the Responses API (docs/computer-use.md): the `computer` and
`computer_use_preview` tools, `computer_call` items (out and replayed), `computer_call_output`
screenshots, and the checks a conversation of them must pass.

A computer call reaches the engine as a TOOL_KIND_COMPUTER call whose arguments are one action in
the Responses shape (a batched `actions` list: one call per action, sharing the call id); its
screenshot as that call's tool output holding one image, lowered exactly as a function call's
image (a marker line, the image in the user turn after). The engine offers the tool in the model
family's own format and coordinate convention and maps coordinates to the screen.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from typing import Annotated, Any, Literal, TypeAlias

from pydantic import Field, Tag

from vlmserve.engine.v1 import engine_pb2 as pb

from ._errors import InvalidRequestError
from ._json import join
from ._output_models import ComputerCallItem
from ._validation import OTHER, UNDOCUMENTED, RequestModel, UnknownTypeParam, by_type

__all__ = [
    "COMPUTER_CALL_NAME",
    "ComputerActionParam",
    "ComputerCallItem",
    "ComputerCallOutputParam",
    "ComputerCallParam",
    "ComputerToolParam",
    "ComputerUsePreviewToolParam",
    "check_call_outputs",
    "computer_call_item",
]

COMPUTER_CALL_NAME = "computer"
ACTION_TYPES = ("click", "double_click", "drag", "keypress", "move", "screenshot", "scroll", "type", "wait")

# ---- tools ---------------------------------------------------------------------------------------


class ComputerToolParam(RequestModel):
    """The computer tool: coordinates in the pixels of the last screenshot."""

    type: Literal["computer"]


class ComputerUsePreviewToolParam(RequestModel):
    """The preview computer tool: coordinates in the display's pixels."""

    type: Literal["computer_use_preview"]
    display_width: int = Field(ge=1, le=65535)
    display_height: int = Field(ge=1, le=65535)
    environment: Literal["windows", "mac", "linux", "ubuntu", "browser"]


AnyComputerTool: TypeAlias = ComputerToolParam | ComputerUsePreviewToolParam


def contract_computer_tool(tool: AnyComputerTool) -> pb.Tool:
    if isinstance(tool, ComputerUsePreviewToolParam):
        return pb.Tool(
            computer=pb.ComputerTool(
                display_width=tool.display_width,
                display_height=tool.display_height,
                environment=tool.environment,
            )
        )
    return pb.Tool(computer=pb.ComputerTool())


# ---- actions -------------------------------------------------------------------------------------

Button = Literal["left", "right", "wheel", "back", "forward"]


class _Pointer(RequestModel):
    x: int
    y: int
    keys: list[str] | None = None


class ClickParam(_Pointer):
    type: Literal["click"]
    button: Button = "left"


class DoubleClickParam(_Pointer):
    type: Literal["double_click"]


class MoveParam(_Pointer):
    type: Literal["move"]


class ScrollParam(_Pointer):
    type: Literal["scroll"]
    scroll_x: int
    scroll_y: int


class PointParam(RequestModel):
    x: int
    y: int


class DragParam(RequestModel):
    type: Literal["drag"]
    path: list[PointParam] = Field(min_length=2)
    keys: list[str] | None = None


class KeypressParam(RequestModel):
    type: Literal["keypress"]
    keys: list[str] = Field(min_length=1)


class TypeParam(RequestModel):
    type: Literal["type"]
    text: str


class ScreenshotParam(RequestModel):
    type: Literal["screenshot"]


class WaitParam(RequestModel):
    type: Literal["wait"]


class UnknownActionParam(UnknownTypeParam):
    unknown = "unknown computer action"
    supported = ACTION_TYPES


ComputerActionParam: TypeAlias = Annotated[
    Annotated[ClickParam, Tag("#click")]
    | Annotated[DoubleClickParam, Tag("#double_click")]
    | Annotated[DragParam, Tag("#drag")]
    | Annotated[KeypressParam, Tag("#keypress")]
    | Annotated[MoveParam, Tag("#move")]
    | Annotated[ScreenshotParam, Tag("#screenshot")]
    | Annotated[ScrollParam, Tag("#scroll")]
    | Annotated[TypeParam, Tag("#type")]
    | Annotated[WaitParam, Tag("#wait")]
    | Annotated[UnknownActionParam, Tag(OTHER), UNDOCUMENTED],
    by_type({kind: f"#{kind}" for kind in ACTION_TYPES}),
]


def action_json(action: RequestModel) -> dict[str, Any]:
    """An action as the contract carries it: its known fields (the held `keys` only when given)."""
    value = action.model_dump(mode="json", exclude_none=True, exclude=set(action.model_extra or ()))
    return dict(value)


# ---- input items ---------------------------------------------------------------------------------


class SafetyCheckParam(RequestModel):
    id: str
    code: str | None = None
    message: str | None = None


class ComputerCallParam(RequestModel):
    """A computer call replayed: `action`, or a batched `actions` list (or both, as this server
    sends them for the `computer` tool: `action` is then the first of `actions`)."""

    type: Literal["computer_call"]
    call_id: str
    action: ComputerActionParam | None = None
    actions: list[ComputerActionParam] | None = None
    pending_safety_checks: list[SafetyCheckParam] = Field(default_factory=list)
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None

    def all_actions(self) -> list[RequestModel]:
        if self.actions:
            return list(self.actions)
        return [self.action] if self.action is not None else []


class ComputerScreenshotParam(RequestModel):
    type: Literal["computer_screenshot"]
    image_url: str | None = None
    file_id: str | None = None


class ComputerCallOutputParam(RequestModel):
    type: Literal["computer_call_output"]
    call_id: str
    output: ComputerScreenshotParam
    acknowledged_safety_checks: list[SafetyCheckParam] | None = None
    id: str | None = None
    status: Literal["in_progress", "completed", "incomplete"] | None = None


def call_actions(item: ComputerCallParam, path: str) -> list[str]:
    """The call's actions as contract arguments (JSON text), in order; one at least."""
    actions = item.all_actions()
    if not actions:
        raise InvalidRequestError(
            f"Missing required parameter: '{join(path, 'action')}'.",
            param=join(path, "action"),
            code="missing_required_parameter",
        )
    return [json.dumps(action_json(action)) for action in actions]


def check_call_outputs(earlier: Iterable[pb.Message], entries: Sequence[tuple[str, Any]]) -> None:
    """Every `computer_call_output` answers a computer call made before it (in the earlier turns
    or in this input), else a 400 naming its `call_id`."""
    known = {
        call.id for message in earlier for call in message.tool_calls if call.kind == pb.TOOL_KIND_COMPUTER
    }
    for path, item in entries:
        if isinstance(item, ComputerCallParam):
            known.add(item.call_id)
        elif isinstance(item, ComputerCallOutputParam) and item.call_id not in known:
            param = join(path, "call_id")
            raise InvalidRequestError(
                f"Invalid value for '{param}': no computer_call with this call_id comes before this output.",
                param=param,
                code="invalid_value",
            )


# ---- output item ---------------------------------------------------------------------------------


def computer_call_item(call: pb.ToolCall, *, item_id: str, call_id: str, batched: bool) -> ComputerCallItem:
    """The engine's computer call as a `computer_call` item; `batched` (the `computer` tool) adds
    the `actions` list beside `action`."""
    try:
        action = json.loads(call.arguments)
    except ValueError:
        action = {"type": "wait"}  # never from the engine, whose arguments are its own JSON
    return ComputerCallItem(id=item_id, call_id=call_id, action=action, actions=[action] if batched else None)
