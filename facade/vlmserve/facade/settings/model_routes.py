"""Which models the facade serves and where their engines are: `--engine`, `--model-alias`,
`--models-file`, or the one engine of `--engine-address`. Pure: nothing here opens a channel.

Each model is a pool: one gRPC target (one engine, a list, or a DNS name) that the engine client
balances round-robin with health checking (docs/deployment.md). `--engine ID=ADDRESS[,ADDRESS...]`
names one; the settings split a flag's value on commas, so an entry without `=` continues the
addresses of the entry before it (`--engine a=h1:1,h2:1,b=h3:1` is two models).
"""

from __future__ import annotations

import json
import tomllib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError

__all__ = [
    "DEFAULT_ALIAS",
    "MODEL_FILE_LIMITS",
    "MODEL_GENERATE_TIMEOUT",
    "MODEL_LIMITS",
    "ModelRoute",
    "ModelsFile",
    "ModelsFileEntry",
    "model_routes",
    "parse_aliases",
    "parse_engine_flags",
    "read_models_file",
]

DEFAULT_ALIAS = "default"
# Facade limits (`Limits`) a model may set for itself: every per-request one that depends on
# the model (its output, its images, how much history and how many tools its context takes).
# The others bound HTTP requests before any routing (body and header sizes, per-key shares).
MODEL_LIMITS = (
    "max_output_tokens",
    "default_max_output_tokens",
    "max_images_per_request",
    "max_image_bytes",
    "max_image_pixels",
    "max_chain_depth",
    "max_tools",
    "max_tool_bytes",
)
# File settings (`Files`) a model may set for itself: a PDF's pages become that model's images.
MODEL_FILE_LIMITS = ("max_pdf_pages", "max_pdf_page_pixels", "pdf_dpi")
# Seconds one generation on this model may take (`--generate-timeout`): a larger model is slower.
MODEL_GENERATE_TIMEOUT = "generate_timeout_s"
_MAX_NAME_CHARS = 256


@dataclass(frozen=True, slots=True)
class ModelRoute:
    """One model: its public id (None: the id its engine reports), names that also select it,
    its engines' gRPC target, and its own limits (a subset of `MODEL_LIMITS`)."""

    id: str | None
    target: str
    aliases: tuple[str, ...] = ()
    limits: Mapping[str, Any] = field(default_factory=dict)

    def names(self) -> tuple[str, ...]:
        return ((self.id,) if self.id is not None else ()) + self.aliases


class ModelsFileEntry(BaseModel):
    """One `[[models]]` table of a models file."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(min_length=1, max_length=_MAX_NAME_CHARS)
    engines: tuple[str, ...] = ()
    aliases: tuple[str, ...] = ()
    limits: dict[str, int | float | None] = Field(default_factory=dict)
    # For the launcher (`python -m vlmserve.facade.launch --models-file`): the engine to start
    # when `engines` is empty, and more flags for it.
    model: str | None = None
    engine_args: tuple[str, ...] = ()


class ModelsFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    models: tuple[ModelsFileEntry, ...] = Field(min_length=1)


def read_models_file(path: Path) -> ModelsFile:
    """A models file: TOML (or JSON when its name ends in .json). Raises ValueError naming it."""
    try:
        text = path.read_text(encoding="utf-8")
        data = json.loads(text) if path.suffix == ".json" else tomllib.loads(text)
        return ModelsFile.model_validate(data)
    except (OSError, ValueError, ValidationError) as error:
        raise ValueError(f"models file {path}: {error}") from None


def parse_engine_flags(values: Sequence[str]) -> list[tuple[str, str]]:
    """`--engine` values (split on commas) -> [(model id, gRPC target)], in order."""
    pools: list[tuple[str, list[str]]] = []
    for value in (v.strip() for v in values):
        if not value:
            continue
        model_id, sep, address = value.partition("=")
        if sep:
            model_id, address = model_id.strip(), address.strip()
            if not model_id or not address:
                raise ValueError(f"--engine {value!r}: MODEL_ID=ADDRESS[,ADDRESS...]")
            pools.append((model_id, [address]))
        elif pools:
            pools[-1][1].append(value)
        else:
            raise ValueError(f"--engine {value!r}: MODEL_ID=ADDRESS[,ADDRESS...] (the model id is missing)")
    return [(model_id, ",".join(addresses)) for model_id, addresses in pools]


def parse_aliases(values: Iterable[str]) -> list[tuple[str, str]]:
    """`--model-alias ALIAS=MODEL_ID` values -> [(alias, model id)]."""
    aliases = []
    for value in (v.strip() for v in values):
        if not value:
            continue
        alias, sep, model_id = value.partition("=")
        if not sep or not alias.strip() or not model_id.strip():
            raise ValueError(f"--model-alias {value!r}: ALIAS=MODEL_ID")
        aliases.append((alias.strip(), model_id.strip()))
    return aliases


def model_routes(
    *,
    engine_address: str,
    engines: Sequence[str] = (),
    aliases: Sequence[str] = (),
    models_file: ModelsFile | None = None,
) -> list[ModelRoute]:
    """Every model the facade serves, the default one first.

    Without `--engine` or a models file: one model, the engine at `engine_address`, known by
    the id it reports and by "default" (as before several models). Otherwise the models of the
    file then of the flags; "default" names the first unless an alias says otherwise.
    """
    declared: list[tuple[str, str, tuple[str, ...], dict[str, Any]]] = []
    for entry in models_file.models if models_file is not None else ():
        if not entry.engines:
            raise ValueError(
                f"model {entry.id!r}: no engines (the launcher fills them in when it starts them)"
            )
        declared.append((entry.id, ",".join(entry.engines), entry.aliases, dict(entry.limits)))
    declared += [(model_id, target, (), {}) for model_id, target in parse_engine_flags(engines)]
    extra = parse_aliases(aliases)
    if not declared:
        if extra:
            raise ValueError("--model-alias needs models named by --engine or --models-file")
        return [ModelRoute(None, engine_address, (DEFAULT_ALIAS,))]
    routes = [
        ModelRoute(
            model_id,
            target,
            tuple(dict.fromkeys((*own, *(alias for alias, to in extra if to == model_id)))),
            _checked_limits(model_id, limits),
        )
        for model_id, target, own, limits in declared
    ]
    _check_names(routes, extra)
    if not any(DEFAULT_ALIAS in route.names() for route in routes):
        first = routes[0]
        routes[0] = ModelRoute(first.id, first.target, (*first.aliases, DEFAULT_ALIAS), first.limits)
    default = next(route for route in routes if DEFAULT_ALIAS in route.names())
    return [default, *(route for route in routes if route is not default)]


def _checked_limits(model_id: str, limits: Mapping[str, Any]) -> dict[str, Any]:
    settable = (*MODEL_LIMITS, *MODEL_FILE_LIMITS, MODEL_GENERATE_TIMEOUT)
    unknown = sorted(set(limits) - set(settable))
    if unknown:
        raise ValueError(
            f"model {model_id!r}: limits {', '.join(unknown)} cannot be set per model "
            f"(these can: {', '.join(settable)})"
        )
    return dict(limits)


def _check_names(routes: Sequence[ModelRoute], aliases: Sequence[tuple[str, str]]) -> None:
    ids = {route.id for route in routes}
    for alias, model_id in aliases:
        if model_id not in ids:
            raise ValueError(f"--model-alias {alias}={model_id}: no model {model_id!r}")
    seen: dict[str, str | None] = {}
    for route in routes:
        for name in route.names():
            if len(name) > _MAX_NAME_CHARS:
                raise ValueError(f"model name {name[:40]!r}... is longer than {_MAX_NAME_CHARS} characters")
            if name in seen:
                raise ValueError(f"model name {name!r} is given to {seen[name]!r} and to {route.id!r}")
            seen[name] = route.id
