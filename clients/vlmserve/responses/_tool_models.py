"""`tools` and `tool_choice` as request models (docs/responses-api.md, Tools)."""

from __future__ import annotations

from typing import Annotated, Any, Literal, TypeAlias

from pydantic import (
    Field,
    Tag,
    field_validator,
)

from ._computer import ComputerToolParam, ComputerUsePreviewToolParam
from ._validation import OTHER, UNDOCUMENTED, RequestModel, by_json_type, by_type, refuse

# ---- tools -------------------------------------------------------------------------------------

# OpenAI's tool types that run on OpenAI's side (or, like tool_search, ask for a feature this
# server has not): accepted, left out of the prompt, and named in `ignored` (the facade's
# x-vlmserve-ignored-tools header), which therefore only ever carries these names.
HOSTED_TOOL_TYPES = frozenset(
    {
        "apply_patch",
        "code_interpreter",
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


# OpenAI's rule for tool names, documented; this server accepts any non-empty name.
_TOOL_NAME_DOC: dict[str, Any] = {"pattern": "^[a-zA-Z0-9_-]{1,64}$"}


class FunctionToolParam(RequestModel):
    type: Literal["function"]
    name: str = Field(json_schema_extra=_TOOL_NAME_DOC)
    description: str | None = None
    # A JSON Schema object; absent means no arguments.
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class CustomToolFormatParam(RequestModel):
    type: str
    syntax: str | None = None
    definition: str | None = None


class CustomToolParam(RequestModel):
    """A free-form tool: offered to the model as a function taking `{"input": string}`."""

    type: Literal["custom"]
    name: str
    description: str | None = None
    format: CustomToolFormatParam | None = None


_HOSTED_DOC: dict[str, Any] = {"enum": sorted(HOSTED_TOOL_TYPES)}


class HostedToolParam(RequestModel):
    """One of OpenAI's hosted tools: accepted, left out of the prompt, named in a header."""

    type: str = Field(json_schema_extra=_HOSTED_DOC)

    @field_validator("type")
    @classmethod
    def _hosted(cls, value: str) -> str:
        if value not in HOSTED_TOOL_TYPES:
            raise refuse(
                "unsupported_value",
                "Invalid value for '{param}': unsupported tool type; supported: function, custom, "
                "namespace, and OpenAI's hosted tools (accepted, but they do not run here).",
            )
        return value


NamespaceMemberParam: TypeAlias = Annotated[
    Annotated[FunctionToolParam, Tag("#function")]
    | Annotated[CustomToolParam, Tag("#custom")]
    | Annotated[HostedToolParam, Tag(OTHER)],
    by_type({"function": "#function", "custom": "#custom"}),
]


class NamespaceToolParam(RequestModel):
    """A group of function and custom tools; each is offered under its own name."""

    type: Literal["namespace"]
    name: str
    description: str | None = None
    tools: list[NamespaceMemberParam] = Field(default_factory=list)


ToolParam: TypeAlias = Annotated[
    Annotated[FunctionToolParam, Tag("#function")]
    | Annotated[CustomToolParam, Tag("#custom")]
    | Annotated[NamespaceToolParam, Tag("#namespace")]
    | Annotated[ComputerToolParam, Tag("#computer")]
    | Annotated[ComputerUsePreviewToolParam, Tag("#computer_use_preview")]
    | Annotated[HostedToolParam, Tag(OTHER)],
    by_type(
        {
            "function": "#function",
            "custom": "#custom",
            "namespace": "#namespace",
            "computer": "#computer",
            "computer_use_preview": "#computer_use_preview",
        }
    ),
]


class NamedToolChoiceParam(RequestModel):
    type: Literal["function", "custom"]
    name: str


class AllowedToolParam(RequestModel):
    """An entry of `allowed_tools`; hosted entries are accepted and mean nothing here."""

    type: str
    name: str | None = None


class AllowedToolsChoiceParam(RequestModel):
    type: Literal["allowed_tools"]
    mode: Literal["auto", "required"]
    tools: list[AllowedToolParam]


class ComputerToolChoiceParam(RequestModel):
    """Forces a computer call (the request must offer a computer tool)."""

    type: Literal["computer", "computer_use_preview"]


class HostedToolChoiceParam(RequestModel):
    type: str

    @field_validator("type")
    @classmethod
    def _refused(cls, value: str) -> str:
        raise refuse(
            "unsupported_value",
            "Invalid value for '{param}': only function, custom and allowed_tools choices are "
            "supported; hosted tools do not run on this server.",
        )


ToolChoiceMode = Literal["none", "auto", "required"]
ToolChoiceObject: TypeAlias = Annotated[
    Annotated[NamedToolChoiceParam, Tag("#named")]
    | Annotated[AllowedToolsChoiceParam, Tag("#allowed_tools")]
    | Annotated[ComputerToolChoiceParam, Tag("#computer")]
    | Annotated[HostedToolChoiceParam, Tag(OTHER), UNDOCUMENTED],
    by_type(
        {
            "function": "#named",
            "custom": "#named",
            "allowed_tools": "#allowed_tools",
            "computer": "#computer",
            "computer_use_preview": "#computer",
        }
    ),
]
ToolChoiceParam: TypeAlias = Annotated[
    Annotated[ToolChoiceMode, Tag("#string")] | Annotated[ToolChoiceObject, Tag("#object")],
    by_json_type("a string or an object"),
]
