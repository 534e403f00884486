"""A request's computer tool -> the model's `computer` function, and its calls back. No MLX.

Runs first in request preparation (`prep/preparer.py`), so rendering, the grammar and the
tool-call parsers see an ordinary strict function tool:

* the request's `ComputerTool` becomes the function `computer` (`actions.model_schema`) whose
  coordinate bounds are those of the screen the next call acts on: the last screenshot in the
  conversation, or the display before any;
* every replayed TOOL_KIND_COMPUTER call becomes that function's call in the model's format and
  convention, mapped through the screenshot that preceded it (a call out of range or of an
  unknown action is INVALID_ARGUMENT naming its field);
* `ComputerCalls` maps the model's calls back: TOOL_KIND_COMPUTER, Responses-shaped action,
  screen pixels; their argument deltas are held back (a computer call streams whole).
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from vlmserve.engine.computer.actions import ActionError, model_schema, to_contract, to_model
from vlmserve.engine.computer.conventions import Convention, Space
from vlmserve.engine.request_errors import invalid_argument
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = ["COMPUTER_TOOL_NAME", "ComputerCalls", "adapt_request", "tool_description"]

log = logging.getLogger(__name__)

COMPUTER_TOOL_NAME = "computer"
ImageSize = Callable[[pb.ImagePart], "tuple[int, int] | None"]


def tool_description(convention: Convention, space: Space | None) -> str:
    lines = [
        "Use a mouse and keyboard to interact with a computer, and take screenshots.",
        "Take a screenshot first when you have not seen the screen yet.",
    ]
    if space is not None:
        lines.append(convention.describe(space))
    return "\n".join(lines)


@dataclass
class ComputerCalls:
    """Maps one request's generated `computer` calls back to the contract."""

    space: Space | None
    _streaming: set[str] = field(default_factory=set)

    def call(self, call: pb.ToolCall) -> pb.ToolCall:
        if call.name != COMPUTER_TOOL_NAME or call.kind == pb.TOOL_KIND_COMPUTER:
            return call
        try:
            action = to_contract(call.arguments, self.space)
        except ActionError as error:
            # Only without a grammar (none could be built for the model): the call stays a
            # function call, which the client sees as it is.
            log.warning("a computer call could not be mapped: %s", error)
            return call
        return pb.ToolCall(
            id=call.id, name=COMPUTER_TOOL_NAME, arguments=json.dumps(action), kind=pb.TOOL_KIND_COMPUTER
        )

    def delta(self, delta: pb.ToolCallDelta) -> pb.ToolCallDelta | None:
        """None for a computer call's deltas: the call streams whole, once complete."""
        if delta.name == COMPUTER_TOOL_NAME:
            self._streaming.add(delta.id)
        return None if delta.id in self._streaming else delta

    def result(self, result: pb.GenerateResult) -> pb.GenerateResult:
        calls = [self.call(call) for call in result.tool_calls]
        if all(a is b for a, b in zip(calls, result.tool_calls, strict=True)):
            return result
        mapped = pb.GenerateResult()
        mapped.CopyFrom(result)
        del mapped.tool_calls[:]
        mapped.tool_calls.extend(calls)
        return mapped


def _computer_tools(request: pb.GenerateRequest) -> list[tuple[int, pb.ComputerTool]]:
    return [
        (i, tool.computer) for i, tool in enumerate(request.tools) if tool.WhichOneof("kind") == "computer"
    ]


def _has_computer_calls(request: pb.GenerateRequest) -> bool:
    return any(
        call.kind == pb.TOOL_KIND_COMPUTER for message in request.messages for call in message.tool_calls
    ) or any(message.tool_output.kind == pb.TOOL_KIND_COMPUTER for message in request.messages)


def adapt_request(
    request: pb.GenerateRequest, convention: Convention, image_size: ImageSize
) -> tuple[pb.GenerateRequest, ComputerCalls | None]:
    """`request` with its computer tool and calls in the model's terms, and the output's map
    back (None, and the request itself, when it has neither)."""
    tools = _computer_tools(request)
    if not tools and not _has_computer_calls(request):
        return request, None
    if len(tools) > 1:
        index = tools[1][0]
        raise invalid_argument(f"tools[{index}]: only one computer tool per request", field=f"tools[{index}]")
    computer = tools[0][1] if tools else pb.ComputerTool()
    for index, tool in enumerate(request.tools):
        if tool.WhichOneof("kind") == "function" and tool.function.name == COMPUTER_TOOL_NAME and tools:
            raise invalid_argument(
                f"tools[{index}]: a function named {COMPUTER_TOOL_NAME!r} clashes with the computer tool",
                field=f"tools[{index}].function.name",
            )
    display = (computer.display_width, computer.display_height)

    def space_for(size: tuple[int, int] | None) -> Space | None:
        if size is None:
            if display[0] and display[1]:
                return convention.space(*display)
            return None
        space = convention.space(*size)
        if display[0] and display[1]:  # the display's pixels, the screenshot's model range
            space = replace(space, width=display[0], height=display[1])
        return space

    adapted = pb.GenerateRequest()
    adapted.CopyFrom(request)
    screenshot: tuple[int, int] | None = None
    for m, message in enumerate(adapted.messages):
        for c, call in enumerate(message.tool_calls):
            if call.kind != pb.TOOL_KIND_COMPUTER:
                continue
            where = f"messages[{m}].tool_calls[{c}].arguments"
            try:
                action = json.loads(call.arguments)
            except ValueError:
                raise invalid_argument(f"{where}: not JSON", field=where) from None
            if not isinstance(action, dict):
                raise invalid_argument(f"{where}: must be a JSON object", field=where)
            try:
                model_action = to_model(action, space_for(screenshot))
            except ActionError as error:
                path = f"{where}.{error.field}" if error.field else where
                raise invalid_argument(f"{path}: {error}", field=path) from None
            call.name = COMPUTER_TOOL_NAME
            call.arguments = json.dumps(model_action)
            call.kind = pb.TOOL_KIND_FUNCTION
        if message.tool_output.kind == pb.TOOL_KIND_COMPUTER:
            message.tool_output.kind = pb.TOOL_KIND_FUNCTION
        for part in [*message.parts, *message.tool_output.parts.parts]:
            if part.WhichOneof("kind") == "image":
                screenshot = image_size(part.image) or screenshot
    space = space_for(screenshot)
    if tools:
        index = tools[0][0]
        adapted.tools[index].CopyFrom(
            pb.Tool(
                function=pb.FunctionTool(
                    name=COMPUTER_TOOL_NAME,
                    description=tool_description(convention, space),
                    parameters_json=json.dumps(model_schema(space)),
                    strict=True,
                )
            )
        )
    return adapted, ComputerCalls(space)
