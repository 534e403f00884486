"""`tools` and `tool_choice` -> contract tools, with the map back to the client's names.

* Function tools are offered as they are (`strict` carried).
* Function and custom tools inside a `namespace` tool are offered like top-level ones, under
  their own name, or `<namespace>__<name>` when that name is already taken.
* Custom (free-form) tools are offered as function tools taking `{"input": string}`; a call
  goes back out as a `custom_tool_call` whose `input` is that string.
* OpenAI's hosted tools (web_search, file_search, ...; `HOSTED_TOOL_TYPES`) cannot run here:
  they are left out of the prompt and reported in `ignored`, never a 400. Any other tool type
  is a 400 naming it by path: it would be dropped unseen, and its text is the client's own (it
  never goes into a header or a log line).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any, Literal

from vlmserve.engine.v1 import engine_pb2 as pb

from ._errors import InvalidRequestError
from ._json import (
    as_list,
    as_object,
    join,
    one_of,
    optional_bool,
    optional_object,
    optional_str,
    required_str,
    wrong_type,
)

ToolKindName = Literal["function", "custom"]

_EMPTY_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}}

# OpenAI's tool types that run on OpenAI's side (or, like tool_search, ask for a feature this
# server has not): accepted, left out of the prompt, and named in `ignored` (the facade's
# x-vlmserve-ignored-tools header), which therefore only ever carries these names.
HOSTED_TOOL_TYPES = frozenset(
    {
        "apply_patch",
        "code_interpreter",
        "computer",
        "computer_use_preview",
        "file_search",
        "image_generation",
        "local_shell",
        "mcp",
        "programmatic_tool_calling",
        "shell",
        "tool_search",
        "web_search",
        "web_search_2025_08_26",
        "web_search_preview",
        "web_search_preview_2025_03_11",
    }
)


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
            pb.Tool(function=_function_tool(tool))
            for tool in self.offered.values()
            if allowed is None or tool.offered_name in allowed
        ]

    def echo(self, allowed: frozenset[str] | None = None) -> list[dict[str, Any]]:
        """The offered tools as Responses function tools, for the response body."""
        return [
            {
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


def parse_tools(value: object, path: str = "tools") -> ToolSet:
    if value is None:
        return ToolSet()
    declared: list[_Declared] = []
    ignored: list[str] = []
    for index, tool in enumerate(as_list(value, path)):
        tool_path = join(path, index)
        obj = as_object(tool, tool_path)
        tool_type = required_str(obj, "type", tool_path)
        if tool_type == "namespace":
            declared.extend(_namespace_tools(obj, tool_path, ignored))
        elif tool_type in ("function", "custom"):
            declared.append(_declared(obj, tool_path, tool_type, None))
        else:
            ignored.append(_hosted(tool_type, tool_path))
    return ToolSet(offered=_offer(declared), ignored=ignored)


def _hosted(tool_type: str, path: str) -> str:
    if tool_type not in HOSTED_TOOL_TYPES:
        raise InvalidRequestError(
            f"Invalid value for '{join(path, 'type')}': unsupported tool type; supported: function, "
            "custom, namespace, and OpenAI's hosted tools (accepted, but they do not run here).",
            param=join(path, "type"),
            code="unsupported_value",
        )
    return tool_type


def _namespace_tools(obj: Mapping[str, Any], path: str, ignored: list[str]) -> list[_Declared]:
    namespace = required_str(obj, "name", path)
    tools_path = join(path, "tools")
    found: list[_Declared] = []
    for index, tool in enumerate(as_list(obj.get("tools", []), tools_path)):
        tool_path = join(tools_path, index)
        inner = as_object(tool, tool_path)
        tool_type = required_str(inner, "type", tool_path)
        if tool_type in ("function", "custom"):
            found.append(_declared(inner, tool_path, tool_type, namespace))
        else:
            # By type only: the namespace's name is the client's text.
            ignored.append(_hosted(tool_type, tool_path))
    return found


def _declared(obj: Mapping[str, Any], path: str, kind: str, namespace: str | None) -> _Declared:
    name = required_str(obj, "name", path)
    if not name:
        raise InvalidRequestError(
            f"Invalid value for '{join(path, 'name')}': a tool name cannot be empty.",
            param=join(path, "name"),
        )
    description = optional_str(obj, "description", path)
    if kind == "custom":
        tool = OfferedTool(
            name,
            name,
            namespace,
            "custom",
            _custom_description(obj, path, description),
            _custom_parameters(),
            False,
        )
        return _Declared(tool, path)
    parameters = optional_object(obj, "parameters", path)
    tool = OfferedTool(
        name,
        name,
        namespace,
        "function",
        description,
        parameters if parameters is not None else _EMPTY_PARAMETERS,
        optional_bool(obj, "strict", path),
    )
    return _Declared(tool, path)


def _custom_parameters() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {"input": {"type": "string", "description": "The tool's free-form input."}},
        "required": ["input"],
        "additionalProperties": False,
    }


def _custom_description(obj: Mapping[str, Any], path: str, description: str | None) -> str:
    lines = [description] if description else []
    tool_format = optional_object(obj, "format", path)
    if tool_format is not None and tool_format.get("type") == "grammar":
        syntax = optional_str(tool_format, "syntax", join(path, "format")) or "grammar"
        definition = optional_str(tool_format, "definition", join(path, "format")) or ""
        lines.append(f"`input` must match this {syntax} grammar:\n{definition}")
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
            raise InvalidRequestError(
                f"Invalid value for '{join(entry.path, 'name')}': duplicate tool name.",
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
    if value is None:
        return ParsedToolChoice(None, "auto")
    if isinstance(value, str):
        mode = one_of(value, tuple(_MODES), path)
        if mode == "required" and not tools.offered:
            raise InvalidRequestError(
                f"Invalid value for '{path}': 'required' needs at least one function tool in 'tools'.",
                param=path,
            )
        return ParsedToolChoice(pb.ToolChoice(mode=_MODES[mode]), mode)
    if not isinstance(value, Mapping):
        raise wrong_type(path, "a string or an object", value)
    choice_type = required_str(value, "type", path)
    if choice_type in ("function", "custom"):
        name = _offered_name(value, path, tools, choice_type)
        return ParsedToolChoice(pb.ToolChoice(function_name=name), {"type": "function", "name": name})
    if choice_type == "allowed_tools":
        return _allowed_tools(value, path, tools)
    raise InvalidRequestError(
        f"Invalid value for '{join(path, 'type')}': only function, custom and allowed_tools choices are "
        "supported; hosted tools do not run on this server.",
        param=join(path, "type"),
        code="unsupported_value",
    )


def _allowed_tools(value: Mapping[str, Any], path: str, tools: ToolSet) -> ParsedToolChoice:
    mode = one_of(required_str(value, "mode", path), ("auto", "required"), join(path, "mode"))
    tools_path = join(path, "tools")
    allowed: set[str] = set()
    for index, entry in enumerate(as_list(value.get("tools"), tools_path)):
        entry_path = join(tools_path, index)
        obj = as_object(entry, entry_path)
        entry_type = required_str(obj, "type", entry_path)
        if entry_type in ("function", "custom"):
            allowed.add(_offered_name(obj, entry_path, tools, entry_type))
    if not allowed and mode == "required":
        raise InvalidRequestError(
            f"Invalid value for '{tools_path}': 'required' needs at least one function or custom tool.",
            param=tools_path,
        )
    echo = {
        "type": "allowed_tools",
        "mode": mode,
        "tools": [{"type": "function", "name": name} for name in sorted(allowed)],
    }
    return ParsedToolChoice(pb.ToolChoice(mode=_MODES[mode]), echo, frozenset(allowed))


def _offered_name(obj: Mapping[str, Any], path: str, tools: ToolSet, kind: str) -> str:
    name = required_str(obj, "name", path)
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
