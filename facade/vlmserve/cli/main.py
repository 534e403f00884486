"""`vlmserve COMMAND ...`: one command for everything the project runs.

Each subcommand is a program of its own that builds its parser from its settings declaration
(vlmserve.server.settings), so `vlmserve engine --help` is `vlmserve-engine --help` under another
name, and there is no second list of flags to keep in step. The subcommand's module is imported
only when it runs: `vlmserve facade` on a machine without MLX never imports it, and a command
whose extra is not installed says which extra to install instead of a traceback.
"""

from __future__ import annotations

# First: gRPC's environment, before anything imports grpc (grpc_env.py).
import vlmserve.server.grpc_env  # noqa: F401

# isort: split

import argparse
import importlib
import os
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import cast

from vlmserve.cli.blas import openblas_preload
from vlmserve.server.version import version

__all__ = ["COMMANDS", "main"]


@dataclass(frozen=True, slots=True)
class Command:
    summary: str
    module: str
    # What installs this command's dependencies, for the message when they are missing.
    extra: str | None = None


ENGINE_EXTRA = "vlmserve[engine] on macOS, vlmserve[cpu] or vlmserve[cuda] on Linux"
COMMANDS: dict[str, Command] = {
    "serve": Command(
        "engine + facade together, one engine per model (what `make run` does): vlmserve serve [MODEL]",
        "vlmserve.facade.launch",
        f"vlmserve[facade] and {ENGINE_EXTRA}",
    ),
    "engine": Command("the gRPC engine alone, serving one model", "vlmserve.engine.cli", ENGINE_EXTRA),
    "facade": Command(
        "the HTTP facade alone (Responses, Chat, Messages APIs, /ui), in front of running engines",
        "vlmserve.facade.cli",
        "vlmserve[facade]",
    ),
    "models": Command(
        "what a models folder or models file holds: family, size, context", "vlmserve.cli.models"
    ),
    "doctor": Command(
        "what this machine gives the engine: MLX backend, memory, BLAS, ports", "vlmserve.cli.doctor"
    ),
    "service": Command(
        "install or remove a launchd agent (macOS) / systemd user unit (Linux) running `vlmserve serve`",
        "vlmserve.cli.service",
    ),
}
# Modules only an extra brings; a subcommand failing to import one of them names the extra.
EXTRA_MODULES = {"mlx", "mlx_vlm", "fastapi", "uvicorn", "starlette", "prometheus_client", "psycopg", "httpx"}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="vlmserve",
        description="Serve vision-language models on MLX: a gRPC engine and an HTTP facade (OpenAI "
        "Responses, Chat Completions, Anthropic Messages). `vlmserve COMMAND --help` shows a "
        "command's options; each can also be set by the environment variable its help names.",
        allow_abbrev=False,
    )
    parser.add_argument("--version", action="version", version=f"vlmserve {version()}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name, command in COMMANDS.items():
        commands.add_parser(name, help=command.summary, add_help=False)
    return parser


def _load(name: str) -> Callable[..., int | None]:
    command = COMMANDS[name]
    try:
        module = importlib.import_module(command.module)
    except ModuleNotFoundError as error:
        missing = (error.name or "").partition(".")[0]
        if command.extra is None or missing not in EXTRA_MODULES:
            raise
        raise SystemExit(
            f"vlmserve {name} needs {missing}, which this install lacks: install {command.extra}"
        ) from None
    return cast(Callable[..., int | None], module.main)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args and args[0] in COMMANDS:
        name, rest = args[0], args[1:]
        if name in ("serve", "engine"):
            preload = openblas_preload(os.environ)
            if preload is not None and name == "engine":
                # The dynamic loader reads LD_PRELOAD only at exec: start again with it set.
                os.execve(
                    sys.executable,
                    [sys.executable, "-m", "vlmserve.cli", *args],
                    {**os.environ, "LD_PRELOAD": preload},
                )
            if preload is not None:
                os.environ["LD_PRELOAD"] = preload  # the engines the launcher starts inherit it
        result = _load(name)(rest, prog=f"vlmserve {name}")
        return result or 0
    parser = build_parser()
    parser.parse_args(args)  # --help, --version, or an unknown command's error
    parser.print_help(sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
