"""Facade settings, each declared once: default, `--flag`, `$VLMSERVE_FACADE_*` and help text all
come from the field below (see vlmserve.server.settings; `vlmserve-facade --help` lists them).

To add one: add a field with `description=` to the model it belongs to; nothing else.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BeforeValidator, ConfigDict, Field, model_validator

from vlmserve.common.documents import DEFAULT_MAX_FILE_BYTES, DocumentLimits
from vlmserve.common.images import DEFAULT_MAX_IMAGE_BYTES, ImageLimits
from vlmserve.facade.settings.api_keys import API_KEYS_ENV, API_KEYS_FILE_ENV, OPERATOR_KEYS_ENV, ApiKeys
from vlmserve.facade.settings.model_routes import ModelRoute, model_routes, read_models_file
from vlmserve.facade.settings.remote_images import RemoteImageSettings
from vlmserve.server.logs import LogFormat
from vlmserve.server.secrets import read_secret_file
from vlmserve.server.settings import DeclaredSettings, Option

__all__ = [
    "ENGINE_TOKEN_ENV",
    "FacadeSettings",
    "Files",
    "Limits",
    "Storage",
    "Timeouts",
    "default_store_path",
]

ENGINE_TOKEN_ENV = "VLMSERVE_ENGINE_TOKEN"


def default_store_path() -> Path:
    """`$VLMSERVE_DATA_DIR/facade.sqlite3`, else `var/facade.sqlite3` under the working directory."""
    data_dir = os.environ.get("VLMSERVE_DATA_DIR")
    return Path(data_dir) / "facade.sqlite3" if data_dir else Path("var") / "facade.sqlite3"


class Limits(DeclaredSettings):
    """Limits: bounds on what one request may ask for (every one has a safe default)"""

    max_request_bytes: int = Field(
        64 * 1024 * 1024, ge=1, description="largest request body; 413 while it is read"
    )
    max_output_tokens: int | None = Field(
        32768,
        ge=1,
        description="upper bound on a request's max_output_tokens (a larger value is a 400); "
        "none: only the engine's own cap applies",
    )
    # Codex never sets max_output_tokens: a turn on a small model must not run to the context limit.
    default_max_output_tokens: int | None = Field(
        1024, ge=1, description="max_output_tokens for requests that set none; none: the engine's cap"
    )
    max_chain_depth: int = Field(256, ge=1, description="responses one previous_response_id chain may replay")
    max_images_per_request: Annotated[int, Option(flag="--max-images")] = Field(
        16, ge=1, description="images per request, earlier turns included (never more than the engine's)"
    )
    # Pixels are read from the header, before any decoding, so bombs are refused undecoded.
    max_image_bytes: int = Field(
        DEFAULT_MAX_IMAGE_BYTES, ge=1, description="bytes per image (never more than the engine's)"
    )
    max_image_pixels: int = Field(
        ImageLimits().max_pixels,
        ge=1,
        description="pixels per image, from its header (never more than the engine's)",
    )
    # What references add (images, bytes) also counts against the image limit and max_request_bytes.
    max_item_references: int = Field(
        100, ge=1, description="item_reference items per request (or per conversation items list)"
    )
    max_tools: int = Field(128, ge=1, description="entries in `tools`")
    # 400k one-character text blocks (12 MB) took 1.2 GB and 14 s of CPU to translate: each part
    # costs far more than its bytes. Both are checked while the body is parsed, before any
    # translation (http/request_body.py).
    max_request_parts: int = Field(
        10_000,
        ge=1,
        description="messages, input items, content parts and blocks in one request, together "
        "(every JSON object in an array); a 400 naming the array past it",
    )
    max_json_objects: int = Field(
        32_768,
        ge=1,
        description="JSON objects in one request body (tool schemas included), counted while it is "
        "parsed; a 400 past it",
    )
    max_tool_bytes: int = Field(64 * 1024, ge=1, description="size of one tool as JSON (its schema, mostly)")
    max_headers: int = Field(100, ge=1, description="request headers per request; 431 above it")
    max_header_bytes: int = Field(
        32 * 1024, ge=1, description="request headers' total size (names + values); 431 above it"
    )
    # Bodies being read and translated hold their bytes here as they arrive (never as declared);
    # a chunk that does not fit is a 503 with Retry-After. The facade's memory peaks at a few
    # times this.
    max_body_bytes_in_flight: int = Field(
        128 * 1024 * 1024,
        ge=1,
        description="request bodies being read and translated at once, in bytes; 503 + Retry-After above it",
    )
    max_body_bytes_in_flight_per_key: int | None = Field(
        None,
        ge=1,
        description="bytes of the bodies in flight one API key may hold (503 + Retry-After above it); "
        "none: half of max-body-bytes-in-flight, at least max-request-bytes. Applies with API keys on",
    )
    # A body trickled a byte a second held a connection (and, before, its declared size) for the
    # whole body timeout.
    min_body_bytes_per_s: int = Field(
        16 * 1024,
        ge=1,
        description="slowest a request body may arrive, after the grace below: each byte buys "
        "1/rate seconds; 408 when the body falls behind",
    )
    body_rate_grace_s: float = Field(
        5.0, gt=0, description="seconds a request body may take before the minimum body rate applies"
    )
    # uvicorn alone times out only idle keep-alive connections (see http/protocol.py).
    max_connections: int = Field(
        1000, ge=1, description="open client connections; a new one past it is answered 503 and closed"
    )
    header_timeout_s: float = Field(
        10.0, gt=0, description="seconds a client has to send a request's line and headers; 408 after it"
    )
    body_timeout_s: float = Field(
        60.0,
        gt=0,
        description="seconds a client has to send a request's body, once its headers are in; 408 after it",
    )
    # One key's 120 background runs filled the engine's queue; the other key got 503 meanwhile.
    max_responses_per_key: int | None = Field(
        32,
        ge=1,
        description="responses (and chat completions) one API key may have running or waiting at once, "
        "background ones included; 429 rate_limit_exceeded + Retry-After above it; none: no limit. "
        "Applies with API keys on",
    )
    # One socket queued 150 x 15 MiB of response.create messages (facade 94 -> 2,030 MiB); each
    # socket now reads one message ahead at most (routes/responses_ws.py), so sockets are the bound.
    max_websockets_per_key: int = Field(
        16,
        ge=1,
        description="WebSocket connections (/v1/responses) one API key may have open at once (with "
        "API keys off: all clients together); the handshake past it is answered 429 + Retry-After",
    )
    # top_logprobs=20 on 16 streams: facade CPU 7.9x, bytes per token 33x.
    max_logprob_responses_per_key: int | None = Field(
        4,
        ge=1,
        description="of those, how many may ask for logprobs (429 rate_limit_exceeded above it); "
        "none: no limit. Applies with API keys on",
    )
    max_engine_calls: int | None = Field(
        64,
        ge=1,
        description="generations this facade runs at the engine at once; more wait (fairly: a free "
        "slot goes to the waiting key holding the fewest); none: no bound (the engine's queue decides)",
    )
    # Their own pool, so slow remote image hosts can never starve the store's threads.
    translation_workers: int = Field(
        8, ge=1, description="threads that translate requests (base64, image checks, remote fetches)"
    )


class Timeouts(DeclaredSettings):
    """Timeouts (seconds) on facade -> engine calls, so no request can hang forever"""

    generate: Annotated[
        float, Option(flag="--generate-timeout", env="VLMSERVE_FACADE_GENERATE_TIMEOUT_S")
    ] = Field(600.0, gt=0, description="seconds one generation (prefill + decode) may take")
    control: Annotated[float, Option(flag="--control-timeout", env="VLMSERVE_FACADE_CONTROL_TIMEOUT_S")] = (
        Field(10.0, gt=0, description="seconds for CountTokens, GetModelInfo, Abort and health calls")
    )
    # So errors the engine finds up front (bad image, context too long) are plain HTTP errors.
    stream_first_message: Annotated[
        float, Option(flag="--stream-first-message-timeout", env="VLMSERVE_FACADE_STREAM_FIRST_MESSAGE_S")
    ] = Field(
        2.0,
        gt=0,
        description="a stream waits this long for the engine's first message before sending headers",
    )
    # Codex does not count SSE comments as activity.
    heartbeat: Annotated[float, Option(flag="--heartbeat", env="VLMSERVE_FACADE_HEARTBEAT_S")] = Field(
        5.0, gt=0, description="a quiet stream (long prefill) sends response.in_progress this often"
    )


class Storage(DeclaredSettings):
    """Storage: how much stored responses and conversations may take, and for how long"""

    # Images count per use here (stored once per content, but each user pays for their own).
    max_stored_bytes_per_key: int | None = Field(
        1024 * 1024 * 1024,
        ge=1,
        description="bytes one API key's stored responses and conversations may take (429 "
        "storage_quota_exceeded above it); none: no limit",
    )
    max_conversation_bytes: int | None = Field(
        64 * 1024 * 1024,
        ge=1,
        description="bytes one conversation may hold (400 conversation_too_large above it); none: no limit",
    )
    # OpenAI keeps responses 30 days; conversations are not subject to it, as with OpenAI.
    response_ttl_s: Annotated[int | None, Option(flag="--response-ttl")] = Field(
        30 * 24 * 3600,
        ge=1,
        description="seconds a stored response is kept after it was created; none: until deleted",
    )
    maintenance_interval_s: float = Field(
        600.0,
        gt=0,
        description="seconds between runs that delete expired responses and return freed space",
    )
    max_response_event_bytes: int | None = Field(
        64 * 1024 * 1024,
        ge=1,
        description="bytes the stored streaming events of one background response may take (for "
        "stream resume); a run passing it is stopped and ends failed; none: no limit",
    )
    lease_ttl_s: Annotated[float, Option(flag="--lease-ttl")] = Field(
        30.0,
        gt=0,
        description="seconds a facade's claim on the responses it is generating lasts unless renewed "
        "(every third of it); after it, a facade sharing the store marks them failed",
    )
    # A full disk made uploads and stored responses 500s and cut stored streams (disk_space.py).
    min_free_disk_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="free space kept on the store's and the files' filesystems: below it /readyz is 503 "
        "and requests that would store something get 507 insufficient_storage",
    )
    replay_cache_bytes: int = Field(
        256 * 1024 * 1024,
        ge=0,
        description="memory for the decoded messages of recent turns, so the next turn of a chain "
        "or conversation does not read them back",
    )


class Files(DeclaredSettings):
    """Files: uploads (POST /v1/files) and the files requests carry (input_file)"""

    # On disk, one folder per API key; never in the response store (SQLite or another backend).
    files_dir: Annotated[Path | None, Option(default_text="files/ beside --store-path")] = Field(
        None,
        description="directory of uploaded files, one folder per API key; facades that share one "
        "response store must share this directory too",
    )
    max_file_bytes: int = Field(
        DEFAULT_MAX_FILE_BYTES,
        ge=1,
        description="bytes per uploaded file, and per file sent inline (input_file file_data)",
    )
    max_file_bytes_per_key: int | None = Field(
        1024 * 1024 * 1024,
        ge=1,
        description="bytes one API key's uploaded files may take on disk, their records included (429 "
        "storage_quota_exceeded above it); none: no limit",
    )
    # Each file costs at least a block on disk and a stat per quota check.
    max_files_per_key: int | None = Field(
        1000, ge=1, description="uploaded files one API key may keep (429 storage_quota_exceeded above it)"
    )
    max_pdf_pages: int = Field(
        DocumentLimits().max_pages,
        ge=1,
        description="pages per PDF (each page reaches the model as an image, and counts as one)",
    )
    max_pdf_page_pixels: int = Field(
        DocumentLimits().max_page_pixels,
        ge=1,
        description="pixels per rendered PDF page (a larger page is rendered smaller)",
    )
    pdf_dpi: float = Field(
        DocumentLimits().dpi, gt=0, le=600, description="resolution PDF pages are rendered at"
    )
    # Rendering runs in worker processes (documents/pdf_workers.py), never in the facade's own.
    pdf_workers: int = Field(
        2, ge=1, description="PDFs rendered at once, each in a worker process of its own"
    )
    pdf_worker_memory_mib: int = Field(
        1024, ge=128, description="address space one PDF worker process may use (RLIMIT_AS)"
    )
    pdf_worker_cpu_s: int = Field(
        30, ge=1, description="CPU seconds one PDF may take to render (RLIMIT_CPU of its worker)"
    )
    pdf_timeout_s: float = Field(
        30.0, gt=0, description="seconds one PDF may take to render, its worker's start-up included"
    )


def _first_token(raw: object) -> object:
    """The engine accepts a comma-separated list (rotation); the facade sends the first."""
    if not isinstance(raw, str):
        return raw
    tokens = [token.strip() for token in raw.split(",") if token.strip()]
    return tokens[0] if tokens else None


def _store_url(raw: object) -> object:
    if isinstance(raw, str) and not raw.startswith(("postgresql://", "postgres://")):
        raise ValueError("a PostgreSQL connection URL: postgresql://user:password@host:port/database")
    return raw


def _api_keys(raw: object) -> object:
    return ApiKeys.from_keys(raw.split(",")) if isinstance(raw, str) else raw


class FacadeSettings(DeclaredSettings):
    """What `vlmserve-facade` serves and how."""

    ENV_PREFIX: ClassVar[str] = "VLMSERVE_FACADE_"
    model_config = ConfigDict(arbitrary_types_allowed=True)

    engine_address: str = Field(
        "127.0.0.1:50051",
        description="engine gRPC target: host:port, unix:/path, or several engines serving the same model "
        "(a:p,b:p, ipv4:a:p,b:p, dns:///name:port), balanced round-robin over the healthy ones; "
        "unused when --engine or --models-file name the models",
    )
    # See settings/model_routes.py and docs/deployment.md ("Several models behind one facade").
    engine: Annotated[tuple[str, ...], Option(metavar="MODEL_ID=ADDRESS[,ADDRESS...]")] = Field(
        (),
        description="a model and the engines serving it (any --engine-address form), selected by "
        "requests' `model`; the first is also `default`",
    )
    model_alias: Annotated[tuple[str, ...], Option(metavar="ALIAS=MODEL_ID")] = Field(
        (), description="another name for a model of --engine or --models-file (default=ID moves `default`)"
    )
    models_file: Path | None = Field(
        None,
        description="TOML (or .json) file of models: [[models]] id, engines, aliases, limits "
        "(docs/deployment.md); --engine adds more",
    )
    host: str = Field("127.0.0.1", description="address to listen on")
    port: int = Field(8000, ge=0, le=65535, description="port to listen on")
    store_path: Annotated[
        Path, Option(default_text="$VLMSERVE_DATA_DIR/facade.sqlite3, else var/facade.sqlite3")
    ] = Field(default_factory=default_store_path, description="SQLite file for stored responses")
    store: Annotated[str | None, BeforeValidator(_store_url)] = Field(
        None,
        repr=False,
        description="PostgreSQL database for stored responses, shared by every facade given it "
        "(postgresql://user:password@host:port/db); none: the SQLite file at store-path",
    )
    # docs/context-management.md: compaction items are sealed with this key, bound to the API key.
    compaction_key_file: Annotated[Path | None, Option(default_text="compaction.key beside --store-path")] = (
        Field(
            None,
            description="file of the 32-byte key that seals compaction items (made on first use, mode 0600); "
            "facades that share one response store must share this file too",
        )
    )
    compaction_keep_images: int = Field(
        2,
        ge=0,
        le=16,
        description="screenshots a compaction keeps as images (the latest); the summary describes older ones",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        "info", description="log level"
    )
    log_format: LogFormat = Field(
        "text", description="log lines as text, or as JSON objects carrying request_id and response_id"
    )
    otlp_endpoint: str | None = Field(
        None,
        description=(
            "export OpenTelemetry spans over OTLP/HTTP to this URL,"
            " e.g. http://127.0.0.1:4318/v1/traces (off when unset)"
        ),
    )
    model_info_ttl_s: float = Field(30.0, gt=0, description="seconds the engine's model info is trusted")
    retry_after_s: int = Field(
        1, ge=0, description="Retry-After (seconds) sent when the engine's queue is full"
    )
    # Listening stops at once; streams still running after the grace are cancelled (engine Abort)
    # and end with a final event.
    shutdown_grace_s: Annotated[float, Option(flag="--shutdown-grace")] = Field(
        30.0, ge=0, description="seconds in-flight requests get to finish on SIGTERM"
    )
    limits: Limits = Field(default_factory=Limits, description="request limits")
    timeouts: Timeouts = Field(default_factory=Timeouts, description="engine call deadlines")
    storage: Storage = Field(default_factory=Storage, description="storage quotas and retention")
    files: Files = Field(default_factory=Files, description="uploaded and inline files")
    api_keys: Annotated[ApiKeys, Option(flag=None, env=API_KEYS_ENV), BeforeValidator(_api_keys)] = Field(
        default_factory=ApiKeys,
        repr=False,
        description="API keys, comma-separated; every route but /healthz then needs one (held as digests)",
    )
    api_keys_file: Annotated[Path | None, Option(env=API_KEYS_FILE_ENV)] = Field(
        None, description="file of API keys, one per line (# comments); added to $VLMSERVE_API_KEYS"
    )
    # /metrics counts every key's traffic: with API keys on, a client's key may not read it.
    operator_keys: Annotated[
        ApiKeys, Option(flag=None, env=OPERATOR_KEYS_ENV), BeforeValidator(_api_keys)
    ] = Field(
        default_factory=ApiKeys,
        repr=False,
        description="operator keys, comma-separated: with API keys on, /metrics needs one of these "
        "(a client's API key gets 403); none: /metrics is closed while API keys are on",
    )
    remote_images: RemoteImageSettings = Field(
        default_factory=RemoteImageSettings, description="remote images"
    )
    # Sent as `authorization: Bearer`; the engine reads the same variable. Never in repr (logged).
    engine_token: Annotated[
        str | None, Option(flag=None, env=ENGINE_TOKEN_ENV), BeforeValidator(_first_token)
    ] = Field(None, repr=False, description="the engine's shared token (the first of a comma-separated list)")
    engine_token_file: Path | None = Field(
        None, description="file holding the engine's shared token (instead of $VLMSERVE_ENGINE_TOKEN)"
    )
    engine_tls_ca: Path | None = Field(None, description="CA certificate (PEM) to verify the engine's TLS")
    engine_tls_cert: Path | None = Field(None, description="client certificate (PEM) for mutual TLS")
    engine_tls_key: Path | None = Field(None, description="client key (PEM) for mutual TLS")

    def model_routes(self) -> list[ModelRoute]:
        """The models served (the default first); ValueError when they are misdeclared."""
        return model_routes(
            engine_address=self.engine_address,
            engines=self.engine,
            aliases=self.model_alias,
            models_file=read_models_file(self.models_file) if self.models_file is not None else None,
        )

    def compaction_key_path(self) -> Path:
        """The compaction key's file: --compaction-key-file, else beside the SQLite store."""
        return self.compaction_key_file or self.store_path.parent / "compaction.key"

    def files_directory(self) -> Path:
        """Where uploaded files live: --files-dir, else `files/` beside the SQLite store."""
        return self.files.files_dir or self.store_path.parent / "files"

    @model_validator(mode="after")
    def _one_body_fits(self) -> FacadeSettings:
        limits = self.limits
        if limits.max_body_bytes_in_flight < limits.max_request_bytes:
            raise ValueError(
                "--max-body-bytes-in-flight must be at least --max-request-bytes (or no body that size fits)"
            )
        per_key = limits.max_body_bytes_in_flight_per_key
        if per_key is not None and not limits.max_request_bytes <= per_key <= limits.max_body_bytes_in_flight:
            raise ValueError(
                "--max-body-bytes-in-flight-per-key must be between --max-request-bytes and "
                "--max-body-bytes-in-flight"
            )
        return self

    def body_bytes_per_key(self) -> int | None:
        """Each API key's share of the bodies in flight; None with keys off (one owner)."""
        if not self.api_keys.enabled:
            return None
        limits = self.limits
        if limits.max_body_bytes_in_flight_per_key is not None:
            return limits.max_body_bytes_in_flight_per_key
        return max(limits.max_request_bytes, limits.max_body_bytes_in_flight // 2)

    @model_validator(mode="before")
    @classmethod
    def _read_secret_files(cls, data: Any) -> Any:
        """Keys and tokens named by file are read now, so a missing or empty file stops start-up:
        an empty key file must never mean "authentication off"."""
        if not isinstance(data, dict):
            return data
        data = dict(data)
        if data.get("api_keys_file") is not None:
            path = Path(data["api_keys_file"])
            keys = ApiKeys.from_keys(read_secret_file(path))
            if not keys.enabled:
                raise ValueError(f"--api-keys-file / ${API_KEYS_FILE_ENV}: no key in {path}")
            configured = _api_keys(data.get("api_keys", ApiKeys()))
            assert isinstance(configured, ApiKeys)
            # dict.fromkeys: a copy made with replace() reads the file again; keep each key once.
            data["api_keys"] = ApiKeys(tuple(dict.fromkeys(configured.digests + keys.digests)))
        if data.get("engine_token_file") is not None:
            path = Path(data["engine_token_file"])
            token = next(iter(read_secret_file(path)), None)
            if token is None:
                raise ValueError(f"--engine-token-file: no token in {path}")
            data["engine_token"] = token
        return data
