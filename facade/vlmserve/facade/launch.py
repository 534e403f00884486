"""`python -m vlmserve.facade.launch` (what `make run` runs): the engine, then the facade, together.

Starts `vlmserve-engine` and waits until it reports SERVING, then starts `vlmserve-facade` pointed
at it and waits until `/readyz` answers. With `--models ID=MODEL ...` (`make run MODELS=...`) or a
models file whose models name a `model`, one engine per model, on consecutive ports, and the
facade routes requests to them by id. SIGTERM/SIGINT stop the facade first (so no request is
accepted that the engine could not finish), then the engine; more signals while stopping change
nothing (`make` passes its SIGTERM on, so a process group gets two). Every path out of the
launcher stops both: a child that outlives its deadline is killed, an exception stops the rest,
and if the launcher itself is killed the children see their lifeline close and stop themselves
(vlmserve.server.lifeline). All deadlines come from the facade's `--shutdown-grace`.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Annotated, ClassVar

import httpx
from pydantic import Field

from vlmserve.client import EngineClient
from vlmserve.facade.cli import server_shutdown_timeout_s
from vlmserve.facade.settings import ENGINE_TOKEN_ENV, FacadeSettings
from vlmserve.facade.settings.api_keys import probe_key
from vlmserve.facade.settings.model_routes import read_models_file
from vlmserve.server.lifeline import LIFELINE_ENV
from vlmserve.server.logs import configure_logging
from vlmserve.server.settings import DeclaredSettings, Option, SettingsError, add_arguments, load, to_argv

logger = logging.getLogger("vlmserve.launch")

POLL_S = 0.2
# Past a child's own shutdown deadline: time to exit once it has stopped serving.
STOP_MARGIN_S = 5.0


class LaunchSettings(DeclaredSettings):
    """The launcher: what it starts and how long it waits"""

    ENV_PREFIX: ClassVar[str] = "VLMSERVE_LAUNCH_"

    model: Annotated[str | None, Option(env="VLMSERVE_MODEL")] = Field(
        None, description="model path or Hugging Face id for the engine (default: the engine's own)"
    )
    # Several models, one engine each (docs/deployment.md, "Several models on one Mac").
    models: Annotated[tuple[str, ...], Option(metavar="ID=MODEL")] = Field(
        (),
        description="serve several models, one engine each (model path or hub id), on --engine-address's "
        "port and the ones after it; requests pick them by ID (the first is also `default`)",
    )
    engine_flags: str | None = Field(
        None,
        description="more flags for every engine started, e.g. '--load lazy --idle-unload-seconds 600'",
    )
    engine_command: str | None = Field(
        None,
        description="the engine program (default: vlmserve-engine next to this Python); "
        "--address, --drain-seconds and --model are appended",
    )
    engine_ready_timeout: float = Field(600.0, gt=0, description="seconds the engine may take to load")
    facade_ready_timeout: float = Field(60.0, gt=0, description="seconds the facade may take to be ready")
    # Every facade setting, passed on to it: one declaration, whichever program is started.
    facade: FacadeSettings = Field(default_factory=FacadeSettings, description="the facade's settings")


PROG = "python -m vlmserve.facade.launch"


def build_parser(prog: str = PROG) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        allow_abbrev=False,
    )
    # `vlmserve serve MODEL` / `vlmserve serve ID=MODEL ID2=MODEL2`: --model / --models, positionally.
    parser.add_argument(
        "positional_models",
        nargs="*",
        metavar="MODEL | ID=MODEL",
        help="the model to serve (as --model), or several as ID=MODEL (as --models)",
    )
    add_arguments(parser, LaunchSettings)
    return parser


def with_positional_models(settings: LaunchSettings, given: Sequence[str]) -> LaunchSettings:
    """MODEL alone is --model; ID=MODEL values are --models. Mixing them, or naming a model both
    ways, is refused (ValueError) rather than one silently winning."""
    if not given:
        return settings
    several = [value for value in given if "=" in value]
    if several and len(several) != len(given):
        raise ValueError("give one MODEL, or ID=MODEL for each of several")
    if not several and len(given) > 1:
        raise ValueError("several models need ids: ID=MODEL ID2=MODEL2")
    if several:
        if settings.models:
            raise ValueError("models given both positionally and with --models")
        return settings.model_copy(update={"models": tuple(several)})
    if settings.model is not None and settings.model != given[0]:
        raise ValueError("the model given both positionally and with --model")
    return settings.model_copy(update={"model": given[0]})


def parse_args(
    argv: Sequence[str] | None = None, environ: Mapping[str, str] | None = None, *, prog: str = PROG
) -> tuple[LaunchSettings, list[str]]:
    """The launcher's settings, and the facade flags given (to pass on to the facade)."""
    parser = build_parser(prog)
    args = parser.parse_args(argv)
    try:
        settings = load(LaunchSettings, environ=os.environ if environ is None else environ, args=args)
        settings = with_positional_models(settings, args.positional_models)
    except (SettingsError, ValueError) as error:
        parser.error(str(error))
    return settings, to_argv(LaunchSettings, args, under="facade")


def _program(name: str) -> list[str]:
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"cannot find {name}; install the package (make install)")
    return [found]


@dataclass(frozen=True, slots=True)
class EngineToStart:
    """One engine the launcher starts: the facade's id for its model (None: the one engine of
    `make run`), the model, where it listens, and flags of its own (a models file's engine_args)."""

    model_id: str | None
    model: str | None
    address: str
    flags: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return "engine" if self.model_id is None else f"engine {self.model_id}"


def engines_to_start(settings: LaunchSettings) -> list[EngineToStart]:
    """`--models`, else the models of `--models-file` that name a `model` and no `engines`, else
    one engine (on --engine-address, with --model). Several listen on consecutive ports."""
    facade = settings.facade
    wanted: list[tuple[str, str, tuple[str, ...]]] = []
    for value in settings.models:
        model_id, sep, model = value.partition("=")
        if not sep or not model_id.strip() or not model.strip():
            raise ValueError(f"--models {value!r}: ID=MODEL")
        wanted.append((model_id.strip(), model.strip(), ()))
    if not wanted and facade.models_file is not None:
        wanted = [
            (entry.id, entry.model, entry.engine_args)
            for entry in read_models_file(facade.models_file).models
            if entry.model is not None and not entry.engines
        ]
    if not wanted:
        return [EngineToStart(None, settings.model, facade.engine_address)]
    host, sep, port = facade.engine_address.rpartition(":")
    if not sep or not port.isdigit() or "," in facade.engine_address or host.startswith("unix"):
        raise ValueError("several engines need --engine-address HOST:PORT (they take PORT, PORT+1, ...)")
    return [
        EngineToStart(model_id, model, f"{host}:{int(port) + index}", flags)
        for index, (model_id, model, flags) in enumerate(wanted)
    ]


def facade_engine_flags(
    settings: LaunchSettings, engines: Sequence[EngineToStart], folder: Path
) -> list[str]:
    """What tells the facade where the started engines are: nothing for the one engine (its
    --engine-address is the facade's too); `--engine ID=ADDRESS` for --models; for a models
    file, a copy with the started engines' addresses filled in (written into `folder`)."""
    if len(engines) == 1 and engines[0].model_id is None:
        return []
    if settings.models or settings.facade.models_file is None:
        return [flag for engine in engines for flag in ("--engine", f"{engine.model_id}={engine.address}")]
    started = {engine.model_id: engine.address for engine in engines}
    declared = read_models_file(settings.facade.models_file)
    filled = [
        {**entry.model_dump(exclude={"model", "engine_args"}), "engines": [started[entry.id]]}
        if entry.id in started
        else entry.model_dump(exclude={"model", "engine_args"})
        for entry in declared.models
    ]
    path = folder / "models.json"
    path.write_text(json.dumps({"models": filled}), encoding="utf-8")
    return ["--models-file", str(path)]


def engine_command(settings: LaunchSettings, engine: EngineToStart | None = None) -> list[str]:
    engine = engine or EngineToStart(None, settings.model, settings.facade.engine_address)
    command = shlex.split(settings.engine_command) if settings.engine_command else _program("vlmserve-engine")
    command += ["--address", engine.address]
    if settings.facade.engine_token_file is not None:
        # The facade sends the token from this file; the engine must ask for it.
        command += ["--auth-token-file", str(settings.facade.engine_token_file)]
    # The engine is stopped after the facade, so its drain only covers what the facade left.
    command += ["--drain-seconds", str(settings.facade.shutdown_grace_s)]
    if engine.model:
        command += ["--model", engine.model]
    if settings.engine_flags:
        command += shlex.split(settings.engine_flags)
    command += engine.flags
    # One log format for both processes.
    command += ["--log-format", settings.facade.log_format]
    if settings.facade.otlp_endpoint is not None:
        # One trace collector for both processes.
        command += ["--otlp-endpoint", settings.facade.otlp_endpoint]
    return command


def facade_command(facade_flags: Sequence[str]) -> list[str]:
    return [*_program("vlmserve-facade"), *facade_flags]


def engine_token_env(settings: FacadeSettings) -> dict[str, str]:
    """With API keys on, the engine must not stay open to anyone on this machine (its Generate,
    Abort and reflection would bypass the keys): unless a token is configured already, one is
    made for this run and handed to both children in the environment (never on a command line,
    where `ps` shows it). The engine requires it; the facade sends it; health stays open."""
    if not settings.api_keys.enabled or settings.engine_token or settings.engine_token_file:
        return {}
    return {ENGINE_TOKEN_ENV: secrets.token_urlsafe(32)}


def stop_timeouts(settings: FacadeSettings) -> dict[str, float]:
    """How long each child gets after SIGTERM before it is killed: all from `shutdown_grace_s`.
    The facade: uvicorn's graceful timeout (the grace, then time for streams to end cleanly)
    plus a margin; the engine: its drain (the same grace) plus a margin."""
    return {
        "facade": server_shutdown_timeout_s(settings) + STOP_MARGIN_S,
        "engine": settings.shutdown_grace_s + STOP_MARGIN_S,
    }


class Launcher:
    def __init__(self, settings: LaunchSettings, facade_flags: Sequence[str]) -> None:
        self.settings = settings
        self.facade_flags = list(facade_flags)
        self.stop_timeouts = stop_timeouts(settings.facade)
        self.processes: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.child_env = engine_token_env(settings.facade)
        self._lifeline: tuple[int, int] | None = None
        self._signals: list[int] = []
        # The facade's models file with the started engines' addresses (several models).
        self._scratch = tempfile.TemporaryDirectory(prefix="vlmserve-launch-")

    def start(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        logger.info("starting %s: %s", name, shlex.join(command))
        if self._lifeline is None:
            # We keep the write end (never inherited); each child gets the read end.
            self._lifeline = os.pipe()
        read_end = self._lifeline[0]
        # Own session: a terminal's Ctrl-C reaches only the launcher, which stops the children in order.
        process = subprocess.Popen(
            command,
            start_new_session=True,
            pass_fds=(read_end,),
            env={**os.environ, **self.child_env, LIFELINE_ENV: str(read_end)},
        )
        self.processes.append((name, process))
        return process

    def wait_until(
        self, name: str, process: subprocess.Popen[bytes], ready: Callable[[], bool], timeout: float
    ) -> bool:
        deadline = time.monotonic() + timeout
        while not self.stopping:
            if process.poll() is not None:
                logger.error("%s exited with status %s before it was ready", name, process.returncode)
                return False
            if ready():
                return True
            if time.monotonic() > deadline:
                logger.error("%s was not ready after %.0f s", name, timeout)
                return False
            time.sleep(POLL_S)
        return False

    def stop_all(self) -> None:
        """Stop every child still running (idempotent). Reverse order: the facade goes first, then
        the engine it depends on. Whatever interrupts this, the children still running are killed."""
        try:
            for name, process in reversed(self.processes):
                if process.poll() is None:
                    timeout = self.stop_timeouts[name.split()[0]]
                    logger.info("stopping %s (up to %.0f s)", name, timeout)
                    process.terminate()
                    try:
                        process.wait(timeout=timeout)
                    except subprocess.TimeoutExpired:
                        logger.warning("%s did not stop in time; killing it", name)
                        process.kill()
                        process.wait()
        finally:
            for _name, process in self.processes:
                if process.poll() is None:
                    process.kill()
                    process.wait()

    def run(self) -> int:
        settings, facade = self.settings, self.settings.facade
        if self.child_env:
            logger.info("API keys are on: the engine requires a token made for this run")
        try:
            engines = engines_to_start(settings)
        except ValueError as error:
            logger.error("%s", error)
            return self._fail()
        started = [(engine, self.start(engine.name, engine_command(settings, engine))) for engine in engines]
        for engine, process in started:
            with EngineClient(engine.address) as client:
                if not self.wait_until(
                    engine.name, process, lambda: client.health(timeout=2.0), settings.engine_ready_timeout
                ):
                    return self._fail()
        routing = facade_engine_flags(settings, engines, Path(self._scratch.name))
        facade_process = self.start("facade", facade_command([*self.facade_flags, *routing]))
        url = f"http://{facade.host}:{facade.port}"
        key = probe_key(key_file=facade.api_keys_file)
        if not self.wait_until(
            "facade", facade_process, lambda: _ready(url, key), settings.facade_ready_timeout
        ):
            return self._fail()
        logger.info(
            "ready: Responses API at %s/v1, a page to try it at %s/ui (%s)",
            url,
            url,
            ", ".join(f"{engine.model_id or 'engine'} at {engine.address}" for engine in engines),
        )
        while not self.stopping:
            for name, process in self.processes:
                if process.poll() is not None:
                    logger.error("%s exited with status %s", name, process.returncode)
                    return self._fail()
            time.sleep(POLL_S)
        self._log_signal()
        self.stop_all()
        return 0

    def close(self) -> None:
        self._scratch.cleanup()

    def _fail(self) -> int:
        self._log_signal()
        self.stop_all()
        return 0 if self.stopping else 1

    @property
    def stopping(self) -> bool:
        """A stop signal came."""
        return bool(self._signals)

    def handle_signal(self, signum: int, frame: FrameType | None) -> None:
        # Only note it, in a list (no lock): the handler runs between two bytecodes of the main
        # thread, which may hold a lock at that moment — a threading.Event's, inside its wait();
        # Event.set() here then waited on that lock for ever (the launcher hung on SIGTERM, seen
        # in CI). Logging likewise can re-enter a stream being written. A repeated signal
        # changes nothing.
        self._signals.append(signum)

    def _log_signal(self) -> None:
        if self._signals:
            names = sorted({signal.Signals(signum).name for signum in self._signals})
            logger.info("received %s (%d signal(s)); stopping", "/".join(names), len(self._signals))


def _ready(url: str, key: str | None) -> bool:
    # /readyz is behind the API key when keys are configured.
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        return httpx.get(f"{url}/readyz", headers=headers, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def main(argv: Sequence[str] | None = None, prog: str = PROG) -> int:
    """`prog`: the name `--help` shows (`vlmserve serve` when run as a subcommand)."""
    settings, facade_flags = parse_args(argv, prog=prog)
    configure_logging(settings.facade.log_level, settings.facade.log_format)
    launcher = Launcher(settings, facade_flags)
    signal.signal(signal.SIGTERM, launcher.handle_signal)
    signal.signal(signal.SIGINT, launcher.handle_signal)
    try:
        return launcher.run()
    finally:
        launcher.stop_all()
        launcher.close()
        logger.info("stopped")


if __name__ == "__main__":
    raise SystemExit(main())
