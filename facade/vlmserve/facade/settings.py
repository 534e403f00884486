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

from vlmserve.common.images import DEFAULT_MAX_IMAGE_BYTES, ImageLimits

from .api_keys import ApiKeys
from .remote_image_checks import RemoteImageSettings

ENV_PREFIX = "VLMSERVE_FACADE_"


def default_store_path() -> Path:
    """`$VLMSERVE_DATA_DIR/facade.sqlite3`, else `var/facade.sqlite3` under the working directory."""
    data_dir = os.environ.get("VLMSERVE_DATA_DIR")
    return Path(data_dir) / "facade.sqlite3" if data_dir else Path("var") / "facade.sqlite3"


@dataclass(frozen=True, slots=True)
class Limits:
    """Bounds on what one request may ask for; every field has a safe default (docs: Limits)."""

    # Request bodies larger than this are refused with 413 while they are read.
    max_request_bytes: int = 64 * 1024 * 1024
    # Upper bound on `max_output_tokens`: a larger value is a 400. None: only the engine's own
    # cap (which silently clamps) applies.
    max_output_tokens: int | None = 32768
    # Applied when a request sets no `max_output_tokens` (Codex never does): a turn on a small
    # model must not run to the context limit. None leaves the engine's own cap in charge.
    default_max_output_tokens: int | None = 1024
    # How many responses a `previous_response_id` chain may replay.
    max_chain_depth: int = 256
    # Images one request may carry (replayed ones included), never more than the engine allows.
    max_images_per_request: int = 16
    # Per image, never more than the engine allows; pixels are read from the header, before
    # any decoding, so decompression bombs are refused without being decoded.
    max_image_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    max_image_pixels: int = ImageLimits().max_pixels
    # `item_reference` items per request (or conversation `items` list). What references add
    # (images, bytes) also counts against the image limit and `max_request_bytes`.
    max_item_references: int = 100
    # `tools`: how many entries, and how large each may be as JSON (its schema, mostly).
    max_tools: int = 128
    max_tool_bytes: int = 64 * 1024
    # Request headers: how many, and their total size (name + value bytes); over either: 431.
    max_headers: int = 100
    max_header_bytes: int = 32 * 1024
    # Threads that translate requests (decode base64, check images, fetch remote images); their
    # own pool, so slow remote hosts can never starve the store's threads.
    translation_workers: int = 8

    def __post_init__(self) -> None:
        for name in (
            "max_request_bytes",
            "max_chain_depth",
            "max_images_per_request",
            "max_item_references",
            "max_image_bytes",
            "max_image_pixels",
            "max_tools",
            "max_tool_bytes",
            "max_headers",
            "max_header_bytes",
            "translation_workers",
        ):
            if getattr(self, name) < 1:
                raise ValueError(f"limits.{name} must be at least 1")


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
    # SIGTERM: listening stops at once; in-flight requests get this long to finish; streams
    # still running then are cancelled (engine Abort) and end with a final event.
    shutdown_grace_s: float = 30.0
    limits: Limits = field(default_factory=Limits)
    timeouts: Timeouts = field(default_factory=Timeouts)
    # Empty: authentication off (from $VLMSERVE_API_KEYS / $VLMSERVE_API_KEYS_FILE; digests only).
    api_keys: ApiKeys = field(default_factory=ApiKeys)
    # Remote http(s) image URLs: off unless enabled ($VLMSERVE_FACADE_REMOTE_IMAGES_*).
    remote_images: RemoteImageSettings = field(default_factory=RemoteImageSettings)
    # Sent to the engine as `authorization: Bearer` ($VLMSERVE_ENGINE_TOKEN, the variable the
    # engine reads too, or --engine-token-file). Never in repr (settings get logged).
    engine_token: str | None = field(default=None, repr=False)
    # TLS to the engine: its CA (PEM); with a client certificate and key, mutual TLS.
    engine_tls_ca: Path | None = None
    engine_tls_cert: Path | None = None
    engine_tls_key: Path | None = None

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> FacadeSettings:
        """Defaults overridden by `VLMSERVE_FACADE_*` variables (see ENV_VARIABLES), API keys from
        `VLMSERVE_API_KEYS[_FILE]` and remote images from `VLMSERVE_FACADE_REMOTE_IMAGES_*`."""
        env = os.environ if environ is None else environ
        settings = cls(
            api_keys=ApiKeys.from_env(env),
            remote_images=RemoteImageSettings.from_env(env),
            engine_token=_first_token(env.get(ENGINE_TOKEN_ENV, "")),
        )
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


ENGINE_TOKEN_ENV = "VLMSERVE_ENGINE_TOKEN"


def _first_token(raw: str) -> str | None:
    """The engine accepts a comma-separated list (rotation); the facade sends the first."""
    tokens = [token.strip() for token in raw.split(",") if token.strip()]
    return tokens[0] if tokens else None


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
    "SHUTDOWN_GRACE_S": ("shutdown_grace_s", float),
    "MAX_REQUEST_BYTES": ("limits.max_request_bytes", int),
    "MAX_OUTPUT_TOKENS": ("limits.max_output_tokens", _optional_int),
    "DEFAULT_MAX_OUTPUT_TOKENS": ("limits.default_max_output_tokens", _optional_int),
    "MAX_CHAIN_DEPTH": ("limits.max_chain_depth", int),
    "MAX_IMAGES_PER_REQUEST": ("limits.max_images_per_request", int),
    "MAX_ITEM_REFERENCES": ("limits.max_item_references", int),
    "MAX_IMAGE_BYTES": ("limits.max_image_bytes", int),
    "MAX_IMAGE_PIXELS": ("limits.max_image_pixels", int),
    "MAX_TOOLS": ("limits.max_tools", int),
    "MAX_TOOL_BYTES": ("limits.max_tool_bytes", int),
    "MAX_HEADERS": ("limits.max_headers", int),
    "MAX_HEADER_BYTES": ("limits.max_header_bytes", int),
    "TRANSLATION_WORKERS": ("limits.translation_workers", int),
    "GENERATE_TIMEOUT_S": ("timeouts.generate", float),
    "CONTROL_TIMEOUT_S": ("timeouts.control", float),
    "STREAM_FIRST_MESSAGE_S": ("timeouts.stream_first_message", float),
    "HEARTBEAT_S": ("timeouts.heartbeat", float),
    "ENGINE_TLS_CA": ("engine_tls_ca", Path),
    "ENGINE_TLS_CERT": ("engine_tls_cert", Path),
    "ENGINE_TLS_KEY": ("engine_tls_key", Path),
}
