"""The project's version, written once: `version` in pyproject.toml. An installed distribution
(wheel or editable) carries it in its metadata; a source tree that was never installed reads it
from the pyproject.toml beside it. `vlmserve --version`, the facade's OpenAPI document and
`vlmserve doctor` all show this."""

from __future__ import annotations

import tomllib
from functools import cache
from importlib import metadata
from pathlib import Path

__all__ = ["DISTRIBUTION", "version"]

DISTRIBUTION = "vlmserve"


@cache
def version() -> str:
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    pyproject = Path(__file__).resolve().parents[3] / "pyproject.toml"
    try:
        return str(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"])
    except (OSError, KeyError, ValueError):
        return "unknown"
