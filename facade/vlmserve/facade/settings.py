"""Facade settings: one frozen dataclass, filled from defaults, then the environment, then the CLI.

pydantic-settings is deliberately not a dependency; the environment variables are read here, by
name, so `vlmserve-facade --help` and docs/responses-api.md can list every one of them.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ENV_PREFIX = "VLMSERVE_FACADE_"


def default_store_path() -> Path:
    """`$VLMSERVE_DATA_DIR/facade.sqlite3`, else `var/facade.sqlite3` under the working directory."""
    data_dir = os.environ.get("VLMSERVE_DATA_DIR")
    return Path(data_dir) / "facade.sqlite3" if data_dir else Path("var") / "facade.sqlite3"


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what one request may ask for. Hardening extends this; every field has a safe default."""

    # Request bodies larger than this are refused with 413 before they are parsed.
    max_request_bytes: int = 64 * 1024 * 1024
    # Upper bound on `max_output_tokens`; None leaves the engine's own cap in charge.
    max_output_tokens: int | None = None
    # Applied when a request sets no `max_output_tokens` (Codex never does): a turn on a small
    # model must not run to the context limit. None leaves the engine's own cap in charge.
    default_max_output_tokens: int | None = 1024
    # How many responses a `previous_response_id` chain may replay.
    max_chain_depth: int = 256


@dataclass(frozen=True, slots=True)
class Timeouts:
    """Deadlines (seconds) on facade -> engine calls, so no request can hang forever."""

    # Whole generation (prefill + decode) for one response.
    generate: float = 600.0
    # CountTokens, GetModelInfo, Abort, health.
    control: float = 10.0
    # A streamed request waits this long for the engine's first message before sending headers,
    # so errors the engine finds up front (bad image, context too long) are plain HTTP errors.
    stream_first_message: float = 2.0
    # While a stream has nothing to send (a long prefill), a `response.in_progress` event this
    # often keeps clients' idle timers alive; Codex does not count SSE comments as activity.
    heartbeat: float = 5.0


@dataclass(frozen=True, slots=True)
class FacadeSettings:
    engine_address: str = "127.0.0.1:50051"
    host: str = "127.0.0.1"
    port: int = 8000
    store_path: Path = field(default_factory=default_store_path)
    log_level: str = "info"
    # How long the engine's model info is trusted before it is asked again.
    model_info_ttl_s: float = 30.0
    # Sent as Retry-After when the engine's admission queue is full.
    retry_after_s: int = 1
    limits: Limits = field(default_factory=Limits)
    timeouts: Timeouts = field(default_factory=Timeouts)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FacadeSettings:
        """Defaults overridden by `VLMSERVE_FACADE_*` variables (see ENV_VARIABLES)."""
        env = os.environ if environ is None else environ
        settings = cls()
        for name, (path, convert) in ENV_VARIABLES.items():
            raw = env.get(ENV_PREFIX + name)
            if raw is not None and raw != "":
                try:
                    value = convert(raw)
                except ValueError as exc:
                    raise ValueError(f"{ENV_PREFIX}{name}: cannot parse {raw!r}") from exc
                settings = settings.replace_path(path, value)
        return settings

    def replace_path(self, path: str, value: Any) -> FacadeSettings:
        """A copy with one (possibly nested, dotted) field replaced."""
        head, _, rest = path.partition(".")
        if not rest:
            return dataclasses.replace(self, **{head: value})
        nested = getattr(self, head)
        return dataclasses.replace(self, **{head: dataclasses.replace(nested, **{rest: value})})


def _optional_int(raw: str) -> int | None:
    return None if raw.lower() in ("", "none") else int(raw)


# Environment variable (after the prefix) -> (settings field path, parser).
ENV_VARIABLES: dict[str, tuple[str, Callable[[str], object]]] = {
    "ENGINE_ADDRESS": ("engine_address", str),
    "HOST": ("host", str),
    "PORT": ("port", int),
    "STORE_PATH": ("store_path", Path),
    "LOG_LEVEL": ("log_level", str),
    "MODEL_INFO_TTL_S": ("model_info_ttl_s", float),
    "RETRY_AFTER_S": ("retry_after_s", int),
    "MAX_REQUEST_BYTES": ("limits.max_request_bytes", int),
    "MAX_OUTPUT_TOKENS": ("limits.max_output_tokens", _optional_int),
    "DEFAULT_MAX_OUTPUT_TOKENS": ("limits.default_max_output_tokens", _optional_int),
    "MAX_CHAIN_DEPTH": ("limits.max_chain_depth", int),
    "GENERATE_TIMEOUT_S": ("timeouts.generate", float),
    "CONTROL_TIMEOUT_S": ("timeouts.control", float),
    "STREAM_FIRST_MESSAGE_S": ("timeouts.stream_first_message", float),
    "HEARTBEAT_S": ("timeouts.heartbeat", float),
}
