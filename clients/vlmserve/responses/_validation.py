"""What the request models share: liberal strict-typed models, unions chosen by JSON type or by
`type`, and the one conversion of a pydantic ValidationError into an InvalidRequestError.

Union members are tagged with a leading "#"; a tag is dropped from an error's `loc`, so `param`
is the JSON path as the client wrote it (`input[2].content[0].image_url`). `code` comes from the
error's type: `missing_required_parameter`, `invalid_type`, `invalid_value`, or the code of a
refusal raised with `refuse`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Self, TypeVar

from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    TypeAdapter,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic.json_schema import SkipJsonSchema
from pydantic_core import PydanticCustomError

from ._errors import InvalidRequestError
from ._json import join, type_name

TAG = "#"
OTHER = "#other"
# Union members that exist only to refuse a value by name stay out of the OpenAPI document.
UNDOCUMENTED: Any = SkipJsonSchema()  # type: ignore[type-arg]


# Fields that carry media wherever they are: in a field we do not read, an image or a file would
# be dropped while the client thinks the model saw it. `annotations` (an output_text part's
# citations, replayed) name files without being media.
MEDIA_FIELDS = frozenset(
    {"image_url", "file_id", "file_data", "file_url", "video_url", "input_audio", "audio_url"}
)
_NOT_MEDIA = frozenset({"annotations"})


class RequestModel(BaseModel):
    """A part of a request: unknown fields kept, types strict; media in an unknown field refused."""

    model_config = ConfigDict(extra="allow", strict=True)

    @model_validator(mode="after")
    def _no_media_in_unknown_fields(self) -> Self:
        if self.model_extra:
            found = media_in(self.model_extra)
            if found is not None:
                raise PydanticCustomError(
                    "unread_media",
                    "Invalid value for '{param}': this field is not read by this server, and media in "
                    "it would not reach the model; send images as input_image parts, video and "
                    "audio as input_video and input_audio parts, and files as input_file parts of a "
                    "message's content.",
                    {"at": found},
                )
        return self


def media_in(extra: Mapping[str, Any]) -> list[str | int] | None:
    """The path (keys and indexes) of the first media field inside unknown fields, or None.
    Iterative: the body's depth is bounded where it is read, not here."""
    stack: list[tuple[Any, list[str | int]]] = [(extra, [])]
    while stack:
        value, at = stack.pop()
        if isinstance(value, Mapping):
            for key, item in value.items():
                if key in MEDIA_FIELDS:
                    return [*at, key]
                if key not in _NOT_MEDIA:
                    stack.append((item, [*at, key]))
        elif isinstance(value, list):
            stack.extend((item, [*at, index]) for index, item in enumerate(value))
    return None


def _json_kind(value: object) -> str | None:
    if isinstance(value, str):
        return "#string"
    if isinstance(value, list):
        return "#array"
    if isinstance(value, Mapping | BaseModel):
        # A model: the object member's value, as serialization meets it.
        return "#object"
    return None


def by_json_type(expected: str) -> Discriminator:
    """Chooses a union member (tagged `#string`, `#array`, `#object`) by the JSON type of the
    value, so that an error names one member's path and a value of another type is one
    `invalid_type` error."""
    return Discriminator(
        _json_kind, custom_error_type="invalid_type", custom_error_message=f"expected {expected}"
    )


def by_type(
    tags: Mapping[str, str], *, implicit: Callable[[Mapping[str, Any]], str] | None = None
) -> Discriminator:
    """Chooses a union member by the value's `type` (`tags`: type -> member tag); anything else
    (no type, an unknown one, not an object) goes to the member tagged `#other`, whose own
    validation says what is wrong and where."""

    def tag(value: object) -> str:
        if not isinstance(value, Mapping):
            return OTHER
        kind = value.get("type")
        if kind is None and implicit is not None:
            kind = implicit(value)
        return tags.get(kind, OTHER) if isinstance(kind, str) else OTHER

    return Discriminator(tag)


def refuse(code: str, message: str) -> PydanticCustomError:
    """A validation error with our code; `{param}` in the message becomes the field's path."""
    return PydanticCustomError(code, message)


class UnknownTypeParam(RequestModel):
    """A union's member for any other `type` (tagged `OTHER`): refused, saying what was not
    known and which types are; a subclass names both."""

    unknown: ClassVar[str]
    supported: ClassVar[Sequence[str]]
    type: str

    @field_validator("type")
    @classmethod
    def _unknown(cls, value: str) -> str:
        supported = ", ".join(cls.supported)
        message = f"Invalid value for '{{param}}': {cls.unknown}; supported: {supported}."
        raise refuse("invalid_value", message)


# ---- ValidationError -> InvalidRequestError ------------------------------------------------------

_EXPECTED = {
    "string_type": "a string",
    "bool_type": "a boolean",
    "int_type": "an integer",
    "int_from_float": "an integer",
    "float_type": "a number",
    "list_type": "an array",
    "dict_type": "an object",
    "model_type": "an object",
    "model_attributes_type": "an object",
}

M = TypeVar("M")


def param_of(location: Sequence[int | str], prefix: str = "") -> str:
    """An error's `loc` as a JSON path: union tags dropped, `input[2].content`."""
    path = prefix
    for part in location:
        if isinstance(part, str) and part.startswith(TAG):
            continue
        path = join(path, part)
    return path


def invalid_request(error: ValidationError, prefix: str = "") -> InvalidRequestError:
    """The first error of a ValidationError, as the client sees it."""
    first = error.errors(include_url=False)[0]
    kind = first["type"]
    context = first.get("ctx") or {}
    # A refusal of a field inside the model (media in an unread field, a sampling key not honoured)
    # names that field: `at` is its path below the model.
    location = [*first["loc"], *context.get("at", ())]
    param = param_of(location, prefix) or None
    where = param or "body"
    if kind == "missing":
        return InvalidRequestError(
            f"Missing required parameter: '{where}'.", param=param, code="missing_required_parameter"
        )
    if kind == "float_type" and isinstance(first["input"], int) and not isinstance(first["input"], bool):
        # An integer too large for a float.
        return InvalidRequestError(f"Invalid value for '{where}': out of range.", param=param)
    if kind in _EXPECTED or kind == "invalid_type":
        expected = _EXPECTED.get(kind) or first["msg"].removeprefix("expected ")
        return InvalidRequestError(
            f"Invalid type for '{where}': expected {expected}, got {type_name(first['input'])}.",
            param=param,
            code="invalid_type",
        )
    if kind == "literal_error":
        return InvalidRequestError(
            f"Invalid value for '{where}': expected one of {context.get('expected', '')}.", param=param
        )
    if kind == "greater_than":
        return InvalidRequestError(
            f"Invalid value for '{where}': must be more than {context.get('gt')}.", param=param
        )
    if kind == "greater_than_equal":
        bound = context.get("ge")
        return InvalidRequestError(f"Invalid value for '{where}': must be at least {bound}.", param=param)
    if kind in ("less_than_equal", "less_than"):
        bound = context.get("le", context.get("lt"))
        return InvalidRequestError(f"Invalid value for '{where}': must be at most {bound}.", param=param)
    if kind in ("invalid_value", "unsupported_value"):
        # Our own refusals (`refuse`): the message is written for the client.
        return InvalidRequestError(first["msg"].replace("{param}", where), param=param, code=kind)
    if kind == "unread_media":
        message = first["msg"].replace("{param}", where)
        return InvalidRequestError(message, param=param, code="unknown_parameter")
    # Anything else pydantic may say (e.g. a float out of range): never its text or the value.
    return InvalidRequestError(f"Invalid value for '{where}'.", param=param)


def parse_as(adapter: TypeAdapter[M], value: object, prefix: str) -> M:
    try:
        return adapter.validate_python(value)
    except ValidationError as error:
        raise invalid_request(error, prefix) from None
