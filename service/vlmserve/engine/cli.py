"""`vlmserve-engine`: serve one mlx-vlm model over gRPC.

    vlmserve-engine                                   # fixture model on 127.0.0.1:50051
    vlmserve-engine --model mlx-community/Qwen2-VL-2B-Instruct-4bit --address unix:/tmp/engine.sock

SIGTERM/SIGINT: health turns NOT_SERVING, new requests are refused, in-flight requests get
`--drain-seconds` to finish, then the rest are cancelled and the process exits.

Authentication (see rpc/auth.py): loopback and unix sockets may run open; any other address needs
`--auth-token-file` / $VLMSERVE_ENGINE_TOKEN or `--tls-client-ca`, else the engine refuses to start.
"""

from __future__ import annotations

# First: gRPC's environment, before anything imports grpc (grpc_env.py).
import vlmserve.server.grpc_env  # noqa: F401

# isort: split

import argparse
import asyncio
import atexit
import logging
import os
import signal
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import ClassVar, Literal, NoReturn

from pydantic import Field, model_validator

from vlmserve.common.tracing import configure_tracing
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.metrics import serve_metrics
from vlmserve.engine.model import DEFAULT_MODEL_PATH
from vlmserve.engine.rpc.auth import EngineSecurity
from vlmserve.engine.rpc.server import EngineServer
from vlmserve.server.lifeline import watch_lifeline
from vlmserve.server.logs import LogFormat, configure_logging
from vlmserve.server.settings import DeclaredSettings, SettingsError, add_arguments, load

log = logging.getLogger("vlmserve.engine")


class EngineCommand(DeclaredSettings):
    """Everything `vlmserve-engine` takes: where to listen, how to stop, who may call, what to serve."""

    ENV_PREFIX: ClassVar[str] = "VLMSERVE_ENGINE_"

    address: str = Field("127.0.0.1:50051", description="host:port, or unix:/path/to.sock")
    host: str | None = Field(None, description="with --port: overrides --address")
    port: int | None = Field(None, ge=0, le=65535, description="with --host (default host 127.0.0.1)")
    drain_seconds: float = Field(30.0, ge=0, description="grace for in-flight requests on SIGTERM")
    metrics_port: int | None = Field(
        None,
        ge=0,
        le=65535,
        description="serve Prometheus /metrics over HTTP on this port (off when unset; 0: any free port)",
    )
    metrics_host: str = Field("127.0.0.1", description="interface for --metrics-port")
    otlp_endpoint: str | None = Field(
        None,
        description=(
            "export OpenTelemetry spans over OTLP/HTTP to this URL,"
            " e.g. http://127.0.0.1:4318/v1/traces (off when unset)"
        ),
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field("INFO", description="log level")
    log_format: LogFormat = Field(
        "text", description="log lines as text, or as JSON objects carrying the request_id"
    )
    security: EngineSecurity = Field(default_factory=EngineSecurity, description="authentication")
    engine: EngineConfig = Field(default_factory=EngineConfig, description="model and bounds")

    @model_validator(mode="after")
    def _host_and_port(self) -> EngineCommand:
        if self.host is not None and self.port is None:
            raise ValueError("--host needs --port")
        return self

    @property
    def listen_address(self) -> str:
        if self.port is not None:
            return f"{self.host or '127.0.0.1'}:{self.port}"
        return self.address


def _parse_args(
    argv: Sequence[str] | None, environ: Mapping[str, str] | None = None, *, prog: str = "vlmserve-engine"
) -> EngineCommand:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Serve an mlx-vlm model over gRPC. Every option can also be set with the environment "
        "variable named in its help; the command line wins.",
        allow_abbrev=False,
    )
    add_arguments(parser, EngineCommand)
    args = parser.parse_args(argv)
    try:
        return load(EngineCommand, environ=os.environ if environ is None else environ, args=args)
    except SettingsError as error:
        parser.error(str(error))


def _warn_without_openblas() -> None:
    """mlx's Linux CPU wheel links a slow reference BLAS; Debian's OpenBLAS is ~15-20x faster."""
    if not sys.platform.startswith("linux"):
        return
    try:
        maps = Path("/proc/self/maps").read_text(errors="replace")
    except OSError:
        maps = ""
    if "openblas" in maps.lower():
        return
    candidates = sorted(Path("/usr/lib").glob("*/openblas-pthread/libblas.so.3"))
    hint = f"export LD_PRELOAD={candidates[0]}" if candidates else "apt-get install libopenblas0-pthread"
    log.warning("OpenBLAS is not preloaded: mlx will use its slow reference BLAS on CPU (%s)", hint)


async def _serve(command: EngineCommand) -> int:
    if command.otlp_endpoint is not None:
        configure_tracing(command.otlp_endpoint, "vlmserve-engine")
    server = EngineServer(command.engine, security=command.security)
    try:
        await server.start(command.listen_address)
    except OSError as error:
        log.error("%s", error)
        return 2
    if command.metrics_port is not None:
        try:
            serve_metrics(server.generator.metrics, command.metrics_host, command.metrics_port)
        except OSError as error:
            log.error(
                "could not serve metrics on %s:%d: %s", command.metrics_host, command.metrics_port, error
            )
            await server.shutdown(grace_seconds=0)
            return 2
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    log.info("loading %s", command.engine.model)
    server.load()
    loading = asyncio.ensure_future(server.wait_loaded())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({loading, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if loading.done() and loading.exception() is not None:
        log.error("could not load %s: %s", command.engine.model, loading.exception())
        stopping.cancel()
        await server.shutdown(grace_seconds=0)
        return 1
    if loading.done():
        log.info(
            "ready: %s",
            server.generator.loaded.info.model_id if server.generator.loaded else command.engine.model,
        )
        await stopping
    else:
        loading.cancel()
    log.info("shutting down: draining for up to %.0fs", command.drain_seconds)
    await server.shutdown(grace_seconds=command.drain_seconds)
    return 0


def main(argv: Sequence[str] | None = None, prog: str = "vlmserve-engine") -> None:
    """`prog`: the name `--help` shows (`vlmserve engine` when run as a subcommand)."""
    command = _parse_args(argv, prog=prog)
    configure_logging(command.log_level, command.log_format)
    if command.engine.model == str(DEFAULT_MODEL_PATH) and not DEFAULT_MODEL_PATH.exists():
        # An installed package has no fixture models (they live in a source checkout).
        log.error("no model given: name one (vlmserve serve MODEL, or --model: a folder or a hub id)")
        sys.exit(2)
    # Never reach for the Hugging Face Hub unless the model is a hub id that is not cached.
    if Path(command.engine.model).exists():
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
    try:
        command.security.check_address(command.listen_address)
    except ValueError as error:
        log.error("%s", error)
        sys.exit(2)
    _warn_without_openblas()
    watch_lifeline()
    if command.engine.distributed != "off":
        from vlmserve.engine.distributed import follow
        from vlmserve.engine.process_group import rank

        try:
            this_rank = rank()
        except RuntimeError as error:
            log.error("%s", error)
            sys.exit(2)
        if this_rank != 0:  # rank 0 serves; the others run its steps on their share of the model
            # Rank 0 sends the stop plan within its drain; 10 s more for its own shutdown.
            # Once rank 0 has gone, destroying MLX's ring group aborts the process.
            _exit_without_teardown(follow(command.engine, grace_seconds=command.drain_seconds + 10))
    _exit_without_teardown(asyncio.run(_serve(command)))


def _exit_without_teardown(code: int) -> NoReturn:
    """End the process once the engine has stopped: Python's exit hooks run (trace export,
    logging), the interpreter's C++ teardown does not. With gRPC's and MLX's threads still winding
    down, their static destructors now and then abort the process ("terminate called without an
    active exception": exit -6 right after a clean drain, seen in a full test run)."""
    atexit._run_exitfuncs()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    main()
