"""`vlmserve-facade`: serve the Responses API on HTTP, in front of one engine."""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path

import uvicorn

from .app import create_app
from .settings import ENV_PREFIX, ENV_VARIABLES, FacadeSettings

LOG_LEVELS = ("critical", "error", "warning", "info", "debug")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vlmserve-facade",
        description="OpenAI Responses API over a vlmserve engine. Every option can also be set with "
        f"an environment variable ({ENV_PREFIX}<NAME>): " + ", ".join(sorted(ENV_VARIABLES)) + ".",
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
    return settings


def main(argv: Sequence[str] | None = None) -> int:
    settings = settings_from_args(argv)
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    logging.getLogger("vlmserve.facade").info(
        "facade on http://%s:%d, engine at %s, store %s",
        settings.host,
        settings.port,
        settings.engine_address,
        settings.store_path,
    )
    # uvicorn stops gracefully on SIGTERM/SIGINT: no new connections, in-flight requests finish.
    uvicorn.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        timeout_graceful_shutdown=int(settings.timeouts.control),
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
