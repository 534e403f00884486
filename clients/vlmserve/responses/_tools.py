"""`tools` and `tool_choice` -> contract tools, with the map back to the client's names.

* Function tools are offered as they are (`strict` carried).
* Function and custom tools inside a `namespace` tool are offered like top-level ones, under
  their own name, or `<namespace>__<name>` when that name is already taken.
* Custom (free-form) tools are offered as function tools taking `{"input": string}`; a call
  goes back out as a `custom_tool_call` whose `input` is that string.
* The computer tool (`computer`, `computer_use_preview`; one per request) is offered as the
  contract's ComputerTool under the name `computer` (kind "computer"); its calls
  go back out as `computer_call` items (`_computer.py`).
* OpenAI's hosted tools (web_search, file_search, ...; `HOSTED_TOOL_TYPES`) cannot run here:
  they are left out of the prompt and reported in `ignored`, never a 400. Any other tool type
  is a 400 naming it by path: it would be dropped unseen, and its text is the client's own (it
  never goes into a header or a log line).
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from vlmserve.engine.v1 import engine_pb2 as pb

from ._computer import (
    COMPUTER_CALL_NAME,
    AnyComputerTool,
    ComputerToolParam,
    ComputerUsePreviewToolParam,
    contract_computer_tool,
)
from ._errors import InvalidRequestError
from ._json import join, missing
from ._tool_models import (
    AllowedToolsChoiceParam,
    ComputerToolChoiceParam,
    CustomToolParam,
    FunctionToolParam,
    NamedToolChoiceParam,
    NamespaceToolParam,
)

ToolKindName = Literal["function", "custom", "computer"]

_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}


@dataclass(frozen=True)
class OfferedTool:
    """A tool as the client declared it, under the name the model is offered."""

    offered_name: str
    name: str
    namespace: str | None
    kind: ToolKindName
    description: str | None
    parameters: Mapping[str, Any]
    strict: bool | None
    # kind "computer" only: the tool as declared.
    computer: AnyComputerTool | None = None


@dataclass(frozen=True)
class ToolSet:
    offered: dict[str, OfferedTool] = field(default_factory=dict)
    ignored: list[str] = field(default_factory=list)

    def call_name(self, namespace: str | None, name: str) -> str:
        """The offered name for a call the client reports as (namespace, name)."""
        if namespace is None:
            return name
        for tool in self.offered.values():
            if tool.namespace == namespace and tool.name == name:
                return tool.offered_name
        return name

    def contract_tools(self, allowed: frozenset[str] | None = None) -> list[pb.Tool]:
        return [
            contract_computer_tool(tool.computer)
            if tool.computer is not None
            else pb.Tool(function=_function_tool(tool))
            for tool in self.offered.values()
            if allowed is None or tool.offered_name in allowed
        ]

    def echo(self, allowed: frozenset[str] | None = None) -> list[dict[str, Any]]:
        """The offered tools as Responses tools (function tools; the computer tool as declared),
        for the response body."""
        return [
            tool.computer.model_dump(mode="json", exclude_none=True)
            if tool.computer is not None
            else {
                "type": "function",
                "name": tool.offered_name,
                "description": tool.description,
                "parameters": dict(tool.parameters),
                "strict": tool.strict,
            }
            for tool in self.offered.values()
            if allowed is None or tool.offered_name in allowed
        ]


@dataclass(frozen=True)
class _Declared:
    """A tool as declared, offered under its own name until `_offer` settles name clashes."""

    tool: OfferedTool
    path: str


def parse_tools(value: Sequence[Any] | None, path: str = "tools") -> ToolSet:
    """Validated `tools` (`_request_models.ToolParam`) -> what the model is offered."""
    if value is None:
        return ToolSet()
    declared: list[_Declared] = []
    ignored: list[str] = []
    for index, tool in enumerate(value):
        tool_path = join(path, index)
        if isinstance(tool, NamespaceToolParam):
            declared.extend(_namespace_tools(tool, tool_path, ignored))
        elif isinstance(tool, FunctionToolParam | CustomToolParam):
            declared.append(_declared(tool, tool_path, None))
        elif isinstance(tool, ComputerToolParam | ComputerUsePreviewToolParam):
            if any(entry.tool.kind == "computer" for entry in declared):
                raise InvalidRequestError(
                    f"Invalid value for '{join(tool_path, 'type')}': only one computer tool per request.",
                    param=join(tool_path, "type"),
                )
            offered = OfferedTool(
                COMPUTER_CALL_NAME, COMPUTER_CALL_NAME, None, "computer", None, {}, None, tool
            )
            declared.append(_Declared(offered, tool_path))
        else:
            # A hosted tool (validation refused every other type). By type only: the rest of
            # the tool, like a namespace's name, is the client's text.
            ignored.append(tool.type)
    return ToolSet(offered=_offer(declared), ignored=ignored)


def _namespace_tools(namespace: NamespaceToolParam, path: str, ignored: list[str]) -> list[_Declared]:
    tools_path = join(path, "tools")
    found: list[_Declared] = []
    for index, tool in enumerate(namespace.tools):
        if isinstance(tool, FunctionToolParam | CustomToolParam):
            found.append(_declared(tool, join(tools_path, index), namespace.name))
        else:
            ignored.append(tool.type)
    return found


def _declared(tool: FunctionToolParam | CustomToolParam, path: str, namespace: str | None) -> _Declared:
    name = tool.name
    if not name:
        raise InvalidRequestError(
            f"Invalid value for '{join(path, 'name')}': a tool name cannot be empty.",
            param=join(path, "name"),
        )
    if isinstance(tool, CustomToolParam):
        offered = OfferedTool(
            name, name, namespace, "custom", _custom_description(tool), _custom_parameters(), False
        )
        return _Declared(offered, path)
    parameters = tool.parameters if tool.parameters is not None else _EMPTY_PARAMETERS
    offered = OfferedTool(name, name, namespace, "function", tool.description, parameters, tool.strict)
    return _Declared(offered, path)


def _custom_parameters() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"input": {"type": "string", "description": "The tool's free-form input."}},
        "required": ["input"],
        "additionalProperties": False,
    }


def _custom_description(tool: CustomToolParam) -> str:
    lines = [tool.description] if tool.description else []
    if tool.format is not None and tool.format.type == "grammar":
        syntax = tool.format.syntax or "grammar"
        lines.append(f"`input` must match this {syntax} grammar:\n{tool.format.definition or ''}")
    lines.append("Put the free-form input in the `input` string.")
    return "\n".join(lines)


def _offer(declared: list[_Declared]) -> dict[str, OfferedTool]:
    counts: dict[str, int] = {}
    for entry in declared:
        counts[entry.tool.name] = counts.get(entry.tool.name, 0) + 1
    offered: dict[str, OfferedTool] = {}
    for entry in declared:
        tool = entry.tool
        name = tool.name
        if counts[name] > 1 and tool.namespace is not None:
            name = f"{tool.namespace}__{tool.name}"
        if name in offered:
            clash = (
                "the computer tool's name"
                if name == COMPUTER_CALL_NAME and any(other.tool.kind == "computer" for other in declared)
                else "duplicate tool name"
            )
            raise InvalidRequestError(
                f"Invalid value for '{join(entry.path, 'name')}': {clash}.",
                param=join(entry.path, "name"),
            )
        offered[name] = replace(tool, offered_name=name)
    return offered


def _function_tool(tool: OfferedTool) -> pb.FunctionTool:
    return pb.FunctionTool(
        name=tool.offered_name,
        description=tool.description or "",
        # Key order and integers kept as the client wrote them.
        parameters_json=json.dumps(tool.parameters, ensure_ascii=False),
        strict=bool(tool.strict),
    )


@dataclass(frozen=True)
class ParsedToolChoice:
    choice: pb.ToolChoice | None
    echo: str | dict[str, Any]
    # Offered names the model may call; None means all of them.
    allowed: frozenset[str] | None = None


_MODES = {
    "none": pb.TOOL_CHOICE_MODE_NONE,
    "auto": pb.TOOL_CHOICE_MODE_AUTO,
    "required": pb.TOOL_CHOICE_MODE_REQUIRED,
}


def parse_tool_choice(value: object, tools: ToolSet, path: str = "tool_choice") -> ParsedToolChoice:
    """A validated `tool_choice` (`_request_models.ToolChoiceParam`) against the offered tools."""
    if value is None:
        return ParsedToolChoice(None, "auto")
    if isinstance(value, str):
        if value == "required" and not tools.offered:
            raise InvalidRequestError(
                f"Invalid value for '{path}': 'required' needs at least one function tool in 'tools'.",
                param=path,
            )
        return ParsedToolChoice(pb.ToolChoice(mode=_MODES[value]), value)
    if isinstance(value, ComputerToolChoiceParam):
        computer = tools.offered.get(COMPUTER_CALL_NAME)
        if computer is None or computer.kind != "computer":
            raise InvalidRequestError(
                f"Invalid value for '{join(path, 'type')}': the request offers no computer tool.",
                param=join(path, "type"),
            )
        return ParsedToolChoice(pb.ToolChoice(function_name=COMPUTER_CALL_NAME), {"type": value.type})
    if isinstance(value, NamedToolChoiceParam):
        name = _offered_name(value.name, path, tools, value.type)
        return ParsedToolChoice(pb.ToolChoice(function_name=name), {"type": "function", "name": name})
    assert isinstance(value, AllowedToolsChoiceParam)  # validation admits nothing else
    return _allowed_tools(value, path, tools)


def _allowed_tools(value: AllowedToolsChoiceParam, path: str, tools: ToolSet) -> ParsedToolChoice:
    tools_path = join(path, "tools")
    allowed: set[str] = set()
    for index, entry in enumerate(value.tools):
        entry_path = join(tools_path, index)
        if entry.type in ("function", "custom"):
            if entry.name is None:
                raise missing(join(entry_path, "name"))
            allowed.add(_offered_name(entry.name, entry_path, tools, entry.type))
        elif entry.type in ("computer", "computer_use_preview") and COMPUTER_CALL_NAME in tools.offered:
            allowed.add(COMPUTER_CALL_NAME)
    if not allowed and value.mode == "required":
        raise InvalidRequestError(
            f"Invalid value for '{tools_path}': 'required' needs at least one function or custom tool.",
            param=tools_path,
        )
    echo = {
        "type": "allowed_tools",
        "mode": value.mode,
        "tools": [{"type": "function", "name": name} for name in sorted(allowed)],
    }
    return ParsedToolChoice(pb.ToolChoice(mode=_MODES[value.mode]), echo, frozenset(allowed))


def _offered_name(name: str, path: str, tools: ToolSet, kind: str) -> str:
    if name in tools.offered and tools.offered[name].kind == kind:
        return name
    matches = [
        tool.offered_name for tool in tools.offered.values() if tool.name == name and tool.kind == kind
    ]
    if len(matches) == 1:
        return matches[0]
    raise InvalidRequestError(
        f"Invalid value for '{join(path, 'name')}': no {kind} tool with this name in 'tools'.",
        param=join(path, "name"),
    )
