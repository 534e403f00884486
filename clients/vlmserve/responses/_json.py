"""Typed reads from untrusted JSON that fail with the exact JSON path of the bad field."""

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


def as_list(value: object, path: str) -> list[Any]:
    if not isinstance(value, list):
        raise wrong_type(path, "an array", value)
    return value


def required_str(obj: Mapping[str, Any], key: str, path: str) -> str:
    value = obj.get(key)
    if value is None:
        raise missing(join(path, key))
    if not isinstance(value, str):
        raise wrong_type(join(path, key), "a string", value)
    return value


def optional_str(obj: Mapping[str, Any], key: str, path: str) -> str | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, str):
        raise wrong_type(join(path, key), "a string", value)
    return value


def optional_bool(obj: Mapping[str, Any], key: str, path: str) -> bool | None:
    value = obj.get(key)
    if value is not None and not isinstance(value, bool):
        raise wrong_type(join(path, key), "a boolean", value)
    return value


def optional_int(obj: Mapping[str, Any], key: str, path: str) -> int | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int):
        raise wrong_type(join(path, key), "an integer", value)
    return value


def optional_number(obj: Mapping[str, Any], key: str, path: str) -> float | None:
    value = obj.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise wrong_type(join(path, key), "a number", value)
    try:
        return float(value)
    except OverflowError:  # an integer too large for a float
        param = join(path, key)
        raise InvalidRequestError(f"Invalid value for '{param}': out of range.", param=param) from None


def optional_object(obj: Mapping[str, Any], key: str, path: str) -> Mapping[str, Any] | None:
    value = obj.get(key)
    if value is None:
        return None
    return as_object(value, join(path, key))


def one_of(value: str, allowed: tuple[str, ...], path: str) -> str:
    if value not in allowed:
        choices = ", ".join(repr(choice) for choice in allowed)
        raise InvalidRequestError(
            f"Invalid value for '{path}': expected one of {choices}.", param=path, code="invalid_value"
        )
    return value
