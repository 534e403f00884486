"""Where each field of the Responses body came from in another API's request (chat completions,
Anthropic Messages): a map that API's translation writes as it writes each field, so an error of
the shared translation (which names the Responses path, `input[3].output[1]`) names the client's
own field (`messages[2].content[1]`) by lookup, not by matching text.

`translated_body` validates what such a translation wrote as the typed Responses body, its errors
renamed at once; the facade takes that body as it is (no second parse)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from ._errors import InvalidRequestError
from ._request_models import CreateResponseBody, parse_body


@dataclass
class PathMap:
    """Responses field path -> the other request's path it was made from."""

    _origins: dict[str, tuple[str, bool]] = field(default_factory=dict)

    def add(self, path: str, origin: str, *, extends: bool = True) -> None:
        """`extends`: a path below `path` is `origin` with the rest appended; False: it is
        `origin` itself (the other API has no such sub-field, e.g. an Anthropic block)."""
        self._origins[path] = (origin, extends)

    def origin(self, path: str) -> str | None:
        """`path`'s own entry, else its nearest recorded ancestor's (with the rest of `path`
        appended where that entry extends: `input[2].content[0].detail` under
        `input[2].content`); None: no ancestor."""
        prefix = path
        while True:
            found = self._origins.get(prefix)
            if found is not None:
                origin, extends = found
                return origin + path[len(prefix) :] if extends else origin
            cut = max(prefix.rfind("."), prefix.rfind("["))
            if cut <= 0:
                return None
            prefix = prefix[:cut]

    def rename(self, path: str) -> str:
        """`path` as the other request's field it came from; a field both APIs spell alike
        (`temperature`) as it is."""
        origin = self.origin(path)
        return path if origin is None else origin


def translated_body(fields: Mapping[str, Any], paths: PathMap) -> CreateResponseBody:
    """The Responses body another API's request was translated to (`fields`, its JSON), typed;
    an error names the other request's field (`paths`)."""
    try:
        return parse_body(fields)
    except InvalidRequestError as error:
        raise error.renamed(paths.rename) from None
