"""JSON paths (`input[2].content`) and the errors that name them."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ._errors import InvalidRequestError


def join(path: str, key: str | int) -> str:
    """`input[3]` + `output` -> `input[3].output`; `input` + 3 -> `input[3]`; `` + `tools` -> `tools`."""
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else key


def type_name(value: object) -> str:
    """The JSON name of a value's type, for messages that must not echo the value itself."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return "unknown"


def wrong_type(path: str, expected: str, value: object) -> InvalidRequestError:
    return InvalidRequestError(
        f"Invalid type for '{path}': expected {expected}, got {type_name(value)}.",
        param=path,
        code="invalid_type",
    )


def missing(path: str) -> InvalidRequestError:
    return InvalidRequestError(
        f"Missing required parameter: '{path}'.", param=path, code="missing_required_parameter"
    )


def as_object(value: object, path: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise wrong_type(path, "an object", value)
    return value


def one_of(value: str, allowed: tuple[str, ...], path: str) -> str:
    if value not in allowed:
        choices = ", ".join(repr(choice) for choice in allowed)
        raise InvalidRequestError(
            f"Invalid value for '{path}': expected one of {choices}.", param=path, code="invalid_value"
        )
    return value
