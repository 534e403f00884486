"""`text` (format: text | json_object | json_schema, verbosity) -> the contract's ResponseFormat.

The engine enforces the format with a grammar; a schema it cannot compile comes back as
INVALID_ARGUMENT naming `response_format.json_schema.schema_json`, which the facade reports as
`text.format.schema`. Types are checked by the request models; here, what they cannot say.
"""

from __future__ import annotations

import json
import re
from typing import Any

from vlmserve.engine.v1 import engine_pb2 as pb

from ._errors import InvalidRequestError
from ._json import missing, one_of
from ._request_models import TextFormatParam, TextParam

__all__ = ["parse_text"]

# OpenAI's rule for json_schema names.
_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


def parse_text(text: TextParam | None) -> tuple[dict[str, Any], pb.ResponseFormat]:
    """(the `text` object the response echoes, the format for the engine)."""
    echo: dict[str, Any] = {"format": {"type": "text"}}
    response_format = pb.ResponseFormat(text=pb.TextFormat())
    if text is not None and text.format is not None:
        echo["format"], response_format = _format(text.format)
    if text is not None and text.verbosity is not None:
        echo["verbosity"] = one_of(text.verbosity, ("low", "medium", "high"), "text.verbosity")
    return echo, response_format


def _format(value: TextFormatParam) -> tuple[dict[str, Any], pb.ResponseFormat]:
    format_type = one_of(value.type, ("text", "json_object", "json_schema"), "text.format.type")
    if format_type == "text":
        return {"type": "text"}, pb.ResponseFormat(text=pb.TextFormat())
    if format_type == "json_object":
        return {"type": "json_object"}, pb.ResponseFormat(json_object=pb.JsonObjectFormat())
    if value.name is None:
        raise missing("text.format.name")
    if not _NAME.match(value.name):
        raise InvalidRequestError(
            "Invalid value for 'text.format.name': use 1-64 letters, digits, underscores or dashes.",
            param="text.format.name",
        )
    if value.schema_ is None:
        raise missing("text.format.schema")
    # Echoed as OpenAI does, schema included (the Open Responses schema types it as null;
    # docs/responses-api.md lists this deviation).
    echo = {
        "type": "json_schema",
        "name": value.name,
        "description": value.description,
        "schema": value.schema_,
        "strict": bool(value.strict),
    }
    contract = pb.JsonSchemaFormat(
        name=value.name,
        description=value.description or "",
        # Key order kept as the client wrote it (property order is the order the model writes).
        schema_json=json.dumps(value.schema_, ensure_ascii=False),
        strict=bool(value.strict),
    )
    return echo, pb.ResponseFormat(json_schema=contract)
