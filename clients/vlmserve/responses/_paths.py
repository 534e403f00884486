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
    # A list of parts -> where each part came from, and how its fields are spelt there.
    _parts: dict[str, tuple[list[str], tuple[tuple[str, str], ...]]] = field(default_factory=dict)

    def add(self, path: str, origin: str, *, extends: bool = True) -> None:
        """`extends`: a path below `path` is `origin` with the rest appended; False: it is
        `origin` itself (the other API has no such sub-field, e.g. an Anthropic block)."""
        self._origins[path] = (origin, extends)

    def add_parts(self, path: str, origins: list[str], fields: tuple[tuple[str, str], ...] = ()) -> None:
        """The list at `path` (`input[2].content`): its part `i` came from `origins[i]` (not
        extended), a field of it named in `fields` (`.image_url`) from that origin's field there
        (`.source`). One entry for the list, not one per part and field: a request of 10,000
        parts kept 50,000 paths here (12 MB)."""
        self._parts[path] = (origins, fields)

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
            part = self._part_origin(prefix, path[len(prefix) :])
            if part is not None:
                return part
            cut = max(prefix.rfind("."), prefix.rfind("["))
            if cut <= 0:
                return None
            prefix = prefix[:cut]

    def _part_origin(self, prefix: str, rest: str) -> str | None:
        """Where `prefix` (a part, `input[2].content[0]`) and `rest` below it came from, when
        `prefix` is in a list recorded by `add_parts`."""
        if not prefix.endswith("]"):
            return None
        opening = prefix.rfind("[")
        recorded = self._parts.get(prefix[:opening])
        index = prefix[opening + 1 : -1]
        if recorded is None or not index.isdigit():
            return None
        origins, fields = recorded
        if int(index) >= len(origins):
            return None
        origin = origins[int(index)]
        for name, spelt in fields:
            if rest == name or rest.startswith((f"{name}.", f"{name}[")):
                return origin + spelt
        return origin

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
