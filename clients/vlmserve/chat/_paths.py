"""Where each field of the Responses body came from in the chat request: a map the translation
writes as it writes each field, so an error of the shared translation (which names the Responses
path, `input[3].output[1]`) names the chat field (`messages[2].content[1]`) by lookup, not by
matching text."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class PathMap:
    """Responses field path -> the chat request's path it was made from."""

    _origins: dict[str, str] = field(default_factory=dict)

    def add(self, path: str, origin: str) -> None:
        self._origins[path] = origin

    def origin(self, path: str) -> str | None:
        """`path`'s own entry, else its nearest recorded ancestor's with the rest of `path`
        appended (`input[2].content[0].detail` under `input[2].content`); None: no ancestor."""
        prefix = path
        while True:
            found = self._origins.get(prefix)
            if found is not None:
                return found + path[len(prefix) :]
            cut = max(prefix.rfind("."), prefix.rfind("["))
            if cut <= 0:
                return None
            prefix = prefix[:cut]
