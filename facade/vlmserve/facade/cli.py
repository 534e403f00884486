"""`vlmserve-facade`: serve the Responses API on HTTP, in front of one engine."""

from __future__ import annotations

import argparse
import dataclasses
import logging
import math
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import uvicorn
from fastapi import FastAPI

from vlmserve.common.netaddr import is_loopback_host

from .api_keys import API_KEYS_ENV, API_KEYS_FILE_ENV, ApiKeys, read_key_file
from .app import create_app
from .remote_image_checks import ENV_PREFIX as REMOTE_IMAGES_ENV_PREFIX
from .responses_api import STREAM_CUTOFF_AFTER_GRACE_S
from .settings import ENV_PREFIX, ENV_VARIABLES, FacadeSettings

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")
# Room for the request line (method, target, version) in uvicorn's header buffer.
_REQUEST_LINE_BYTES = 8 * 1024


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vlmserve-facade",
        description="OpenAI Responses API over a vlmserve engine. Every option can also be set with "
        f"an environment variable ({ENV_PREFIX}<NAME>): " + ", ".join(sorted(ENV_VARIABLES)) + ". "
        f"API keys: ${API_KEYS_ENV} (comma-separated) or a file (${API_KEYS_FILE_ENV}, "
        f"--api-keys-file). Remote images: ${REMOTE_IMAGES_ENV_PREFIX}<FIELD>.",
    )
    parser.add_argument("--engine-address", help="engine gRPC target, host:port or unix:/path")
    parser.add_argument("--host", help="address to listen on (default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port to listen on (default 8000)")
    parser.add_argument("--store-path", type=Path, help="SQLite file for stored responses")
    parser.add_argument("--log-level", choices=LOG_LEVELS)
    parser.add_argument("--max-output-tokens", type=int, help="upper bound on max_output_tokens")
    parser.add_argument(
        "--default-max-output-tokens", type=int, help="max_output_tokens for requests that set none"
    )
    parser.add_argument("--generate-timeout", type=float, help="seconds one generation may take")
    parser.add_argument("--max-request-bytes", type=int, help="largest request body (413 above it)")
    parser.add_argument("--max-images", type=int, help="images per request (earlier turns included)")
    parser.add_argument("--shutdown-grace", type=float, help="seconds in-flight requests get on SIGTERM")
    parser.add_argument(
        "--api-keys-file",
        type=Path,
        help="file of API keys, one per line; every route but /healthz then needs one "
        "(keys are never taken from the command line)",
    )
    engine = parser.add_argument_group("engine authentication (see docs/responses-api.md)")
    engine.add_argument(
        "--engine-token-file",
        type=Path,
        help="file holding the engine's shared token (default: $VLMSERVE_ENGINE_TOKEN); never on the "
        "command line",
    )
    engine.add_argument("--engine-tls-ca", type=Path, help="CA certificate (PEM) to verify the engine's TLS")
    engine.add_argument("--engine-tls-cert", type=Path, help="client certificate (PEM) for mutual TLS")
    engine.add_argument("--engine-tls-key", type=Path, help="client key (PEM) for mutual TLS")
    remote = parser.add_argument_group("remote images (off by default)")
    remote.add_argument(
        "--allow-remote-images-from",
        action="append",
        metavar="DOMAIN",
        help="fetch http(s) image URLs from this host (exact, or *.example.com for names below "
        "it); repeat for more; enables remote images",
    )
    remote.add_argument(
        "--remote-images-allow-http",
        action="store_true",
        default=None,
        help="allow http:// (default https only)",
    )
    remote.add_argument("--remote-image-max-bytes", type=int, help="bytes per fetched image")
    remote.add_argument("--remote-images-max-request-bytes", type=int, help="fetched bytes per request")
    remote.add_argument("--remote-image-timeout", type=float, help="seconds per fetched image")
    return parser


_CLI_FIELDS = {
    "engine_address": "engine_address",
    "host": "host",
    "port": "port",
    "store_path": "store_path",
    "log_level": "log_level",
    "max_output_tokens": "limits.max_output_tokens",
    "default_max_output_tokens": "limits.default_max_output_tokens",
    "generate_timeout": "timeouts.generate",
    "max_request_bytes": "limits.max_request_bytes",
    "max_images": "limits.max_images_per_request",
    "shutdown_grace": "shutdown_grace_s",
    "engine_tls_ca": "engine_tls_ca",
    "engine_tls_cert": "engine_tls_cert",
    "engine_tls_key": "engine_tls_key",
}

_REMOTE_IMAGE_FIELDS = {
    "remote_images_allow_http": "allow_http",
    "remote_image_max_bytes": "max_bytes_per_image",
    "remote_images_max_request_bytes": "max_bytes_per_request",
    "remote_image_timeout": "timeout_s",
}


def settings_from_args(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None
) -> FacadeSettings:
    """Defaults, then `VLMSERVE_FACADE_*` variables, then command-line options."""
    args = build_parser().parse_args(argv)
    settings = FacadeSettings.from_env(os.environ if environ is None else environ)
    for name, path in _CLI_FIELDS.items():
        value = getattr(args, name)
        if value is not None:
            settings = settings.replace_path(path, value)
    if args.api_keys_file is not None:
        keys = ApiKeys.from_keys([*read_key_file(args.api_keys_file)])
        if not keys.enabled:
            # An empty file must never mean "authentication off".
            raise SystemExit(f"--api-keys-file: no key in {args.api_keys_file}")
        settings = dataclasses.replace(settings, api_keys=ApiKeys(settings.api_keys.digests + keys.digests))
    if args.engine_token_file is not None:
        token = next(iter(read_key_file(args.engine_token_file)), None)
        if token is None:
            raise SystemExit(f"--engine-token-file: no token in {args.engine_token_file}")
        settings = dataclasses.replace(settings, engine_token=token)
    remote: dict[str, Any] = {
        field: getattr(args, name)
        for name, field in _REMOTE_IMAGE_FIELDS.items()
        if getattr(args, name) is not None
    }
    if args.allow_remote_images_from:
        remote.update(enabled=True, allowed_domains=tuple(args.allow_remote_images_from))
    if remote:
        settings = dataclasses.replace(
            settings, remote_images=dataclasses.replace(settings.remote_images, **remote)
        )
    return settings


def server_shutdown_timeout_s(settings: FacadeSettings) -> int:
    """uvicorn's graceful-shutdown timeout: the grace, plus time for streams to end cleanly."""
    return math.ceil(settings.shutdown_grace_s + STREAM_CUTOFF_AFTER_GRACE_S) + 2


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from_args(argv)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logger = logging.getLogger("vlmserve.facade")
    remote = settings.remote_images
    logger.info(
        "facade on http://%s:%d, engine at %s, store %s, API keys: %s, remote images: %s",
        settings.host,
        settings.port,
        settings.engine_address,
        settings.store_path,
        f"{len(settings.api_keys.digests)} configured" if settings.api_keys.enabled else "off",
        ", ".join(remote.allowed_domains) or "none allowed" if remote.enabled else "off",
    )
    if not settings.api_keys.enabled and not is_loopback_host(settings.host):
        logger.warning("listening on %s without API keys: anyone who can reach it can use it", settings.host)
    uvicorn.Server(server_config(create_app(settings), settings)).run()
    return 0


def server_config(app: FastAPI, settings: FacadeSettings) -> uvicorn.Config:
    """How uvicorn serves the facade (also used by tests with port 0)."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        # On SIGTERM/SIGINT uvicorn stops listening at once; in-flight requests get
        # `shutdown_grace_s` (streams: see responses_api), then the app shuts down.
        timeout_graceful_shutdown=server_shutdown_timeout_s(settings),
        # h11 (not httptools, if installed) so the header buffer is bounded: request line and
        # headers together; HeaderLimits then checks the headers themselves.
        http="h11",
        h11_max_incomplete_event_size=settings.limits.max_header_bytes + _REQUEST_LINE_BYTES,
        # Client addresses come from the socket, never from X-Forwarded-* headers.
        proxy_headers=False,
    )


if __name__ == "__main__":
    raise SystemExit(main())
