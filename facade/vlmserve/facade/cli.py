"""`vlmserve-facade`: serve the Responses API on HTTP, in front of one engine."""

from __future__ import annotations

import argparse
import logging
import math
import os
from collections.abc import Mapping, Sequence
from urllib.parse import urlsplit, urlunsplit

import uvicorn
from fastapi import FastAPI

from vlmserve.common.tracing import configure_tracing
from vlmserve.facade.app import create_app
from vlmserve.facade.http.body_memory import return_large_blocks_to_the_os
from vlmserve.facade.http.protocol import bounded_protocol
from vlmserve.facade.http.server import FacadeServer
from vlmserve.facade.responses.delivery import STREAM_CUTOFF_AFTER_GRACE_S
from vlmserve.facade.settings import FacadeSettings
from vlmserve.server.lifeline import watch_lifeline
from vlmserve.server.logs import configure_logging
from vlmserve.server.netaddr import is_loopback_host
from vlmserve.server.settings import SettingsError, add_arguments, load

# Room for the request line (method, target, version) in uvicorn's header buffer.
_REQUEST_LINE_BYTES = 8 * 1024


def build_parser(prog: str = "vlmserve-facade") -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="OpenAI Responses API over a vlmserve engine. Every option can also be set with the "
        "environment variable named in its help; the command line wins.",
        allow_abbrev=False,
    )
    add_arguments(parser, FacadeSettings)
    return parser


def settings_from_args(
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    *,
    prog: str = "vlmserve-facade",
) -> FacadeSettings:
    """Declared defaults, then the environment, then command-line options."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        settings = load(FacadeSettings, environ=os.environ if environ is None else environ, args=args)
        # A bad --engine, --model-alias or models file stops start-up with its reason.
        settings.model_routes()
    except (SettingsError, ValueError) as error:
        parser.error(str(error))
    return settings


def redacted_url(url: str) -> str:
    """A database URL fit for a log: its password replaced."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def server_shutdown_timeout_s(settings: FacadeSettings) -> int:
    """uvicorn's graceful-shutdown timeout: the grace, plus time for streams to end cleanly."""
    return math.ceil(settings.shutdown_grace_s + STREAM_CUTOFF_AFTER_GRACE_S) + 2


def main(argv: Sequence[str] | None = None, prog: str = "vlmserve-facade") -> int:
    """`prog`: the name `--help` shows (`vlmserve facade` when run as a subcommand)."""
    settings = settings_from_args(argv, prog=prog)
    configure_logging(settings.log_level, settings.log_format)
    logger = logging.getLogger("vlmserve.facade")
    if settings.otlp_endpoint is not None:
        configure_tracing(settings.otlp_endpoint, "vlmserve-facade")
    remote = settings.remote_images
    logger.info(
        "facade on http://%s:%d, engine at %s, store %s, API keys: %s, remote images: %s",
        settings.host,
        settings.port,
        settings.engine_address,
        "PostgreSQL at " + redacted_url(settings.store) if settings.store else settings.store_path,
        f"{len(settings.api_keys.digests)} configured" if settings.api_keys.enabled else "off",
        ", ".join(remote.allowed_domains) or "none allowed" if remote.enabled else "off",
    )
    if not settings.api_keys.enabled and not is_loopback_host(settings.host):
        logger.warning("listening on %s without API keys: anyone who can reach it can use it", settings.host)
    watch_lifeline()
    return_large_blocks_to_the_os()
    FacadeServer(server_config(create_app(settings), settings)).run()
    return 0


def server_config(app: FastAPI, settings: FacadeSettings) -> uvicorn.Config:
    """How uvicorn serves the facade (also used by tests with port 0)."""
    return uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        # uvicorn's lines go through our root handler (one format, the request ids on them).
        log_config=None,
        # On SIGTERM/SIGINT uvicorn stops listening at once; in-flight requests get
        # `shutdown_grace_s` (streams: see responses_api), then the app shuts down.
        timeout_graceful_shutdown=server_shutdown_timeout_s(settings),
        # uvicorn's h11 protocol (not httptools, if installed) so the header buffer is bounded:
        # request line and headers together; HeaderLimits then checks the headers themselves.
        # Slow and numerous clients: a connection cap and a header deadline (http/protocol.py).
        http=bounded_protocol(
            max_connections=settings.limits.max_connections,
            header_timeout_s=settings.limits.header_timeout_s,
            retry_after_s=settings.retry_after_s,
        ),
        h11_max_incomplete_event_size=settings.limits.max_header_bytes + _REQUEST_LINE_BYTES,
        # Client addresses come from the socket, never from X-Forwarded-* headers.
        proxy_headers=False,
        # The app reads a socket's next message only when it has room for it
        # (routes/responses_ws.py); uvicorn's sans-I/O WebSocket protocol (auto's choice) stops
        # reading the socket while a message waits for the app, the legacy one queues up to this
        # many (default 32, each up to ws_max_size): one, so what waits beyond is the client's.
        ws_max_queue=1,
    )


if __name__ == "__main__":
    raise SystemExit(main())
