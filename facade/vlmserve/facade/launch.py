"""`python -m vlmserve.facade.launch` (what `make run` runs): the engine, then the facade, together.

Starts `vlmserve-engine` and waits until it reports SERVING, then starts `vlmserve-facade` pointed
at it and waits until `/readyz` answers. SIGTERM/SIGINT stop the facade first (so no request is
accepted that the engine could not finish), then the engine. If either process dies, the other
is stopped and the launcher exits with an error.
"""

from __future__ import annotations

import argparse
import logging
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import FrameType

import httpx

from vlmserve.client import EngineClient

from .api_keys import probe_key

logger = logging.getLogger("vlmserve.launch")

POLL_S = 0.2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m vlmserve.facade.launch", description=__doc__)
    parser.add_argument("--engine-address", default="127.0.0.1:50051", help="host:port or unix:/path")
    parser.add_argument("--model", help="model path or id for the engine (default: its own default)")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--store-path", type=Path, help="SQLite file for stored responses")
    parser.add_argument("--log-level", default="info")
    parser.add_argument("--engine-ready-timeout", type=float, default=600.0, help="seconds to load the model")
    parser.add_argument("--facade-ready-timeout", type=float, default=60.0)
    parser.add_argument("--stop-timeout", type=float, default=20.0, help="seconds each process gets to stop")
    parser.add_argument(
        "--engine-command",
        help="the engine program (default: vlmserve-engine next to this Python); --address and "
        "--model are appended",
    )
    return parser


def _program(name: str) -> list[str]:
    beside = Path(sys.executable).parent / name
    found = str(beside) if beside.exists() else shutil.which(name)
    if found is None:
        raise SystemExit(f"cannot find {name}; install the package (make install)")
    return [found]


def engine_command(args: argparse.Namespace) -> list[str]:
    command = shlex.split(args.engine_command) if args.engine_command else _program("vlmserve-engine")
    command += ["--address", args.engine_address]
    if args.model:
        command += ["--model", args.model]
    return command


def facade_command(args: argparse.Namespace) -> list[str]:
    command = [
        *_program("vlmserve-facade"),
        *("--engine-address", args.engine_address),
        *("--host", args.host, "--port", str(args.port)),
        *("--log-level", args.log_level),
    ]
    if args.store_path is not None:
        command += ["--store-path", str(args.store_path)]
    return command


class Launcher:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.processes: list[tuple[str, subprocess.Popen[bytes]]] = []
        self.stopping = threading.Event()

    def start(self, name: str, command: list[str]) -> subprocess.Popen[bytes]:
        logger.info("starting %s: %s", name, shlex.join(command))
        # Own session: a terminal's Ctrl-C reaches only the launcher, which stops the children in order.
        process = subprocess.Popen(command, start_new_session=True)
        self.processes.append((name, process))
        return process

    def wait_until(
        self, name: str, process: subprocess.Popen[bytes], ready: Callable[[], bool], timeout: float
    ) -> bool:
        deadline = time.monotonic() + timeout
        while not self.stopping.is_set():
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
        # Reverse order: the facade goes first, then the engine it depends on.
        for name, process in reversed(self.processes):
            if process.poll() is None:
                logger.info("stopping %s", name)
                process.terminate()
                try:
                    process.wait(timeout=self.args.stop_timeout)
                except subprocess.TimeoutExpired:
                    logger.warning("%s did not stop in time; killing it", name)
                    process.kill()
                    process.wait()

    def run(self) -> int:
        args = self.args
        engine = self.start("engine", engine_command(args))
        with EngineClient(args.engine_address) as client:
            if not self.wait_until(
                "engine", engine, lambda: client.health(timeout=2.0), args.engine_ready_timeout
            ):
                return self._fail()
        facade = self.start("facade", facade_command(args))
        url = f"http://{args.host}:{args.port}"
        if not self.wait_until("facade", facade, lambda: _ready(url), args.facade_ready_timeout):
            return self._fail()
        logger.info("ready: Responses API at %s/v1 (engine at %s)", url, args.engine_address)
        while not self.stopping.is_set():
            for name, process in self.processes:
                if process.poll() is not None:
                    logger.error("%s exited with status %s", name, process.returncode)
                    return self._fail()
            self.stopping.wait(POLL_S)
        self.stop_all()
        return 0

    def _fail(self) -> int:
        self.stop_all()
        return 0 if self.stopping.is_set() else 1

    def handle_signal(self, signum: int, frame: FrameType | None) -> None:
        logger.info("received %s; stopping", signal.Signals(signum).name)
        self.stopping.set()


def _ready(url: str) -> bool:
    # /readyz is behind the API key when keys are configured; the facade child shares our env.
    key = probe_key()
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        return httpx.get(f"{url}/readyz", headers=headers, timeout=2.0).status_code == 200
    except httpx.HTTPError:
        return False


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    launcher = Launcher(args)
    signal.signal(signal.SIGTERM, launcher.handle_signal)
    signal.signal(signal.SIGINT, launcher.handle_signal)
    try:
        return launcher.run()
    finally:
        launcher.stop_all()


if __name__ == "__main__":
    raise SystemExit(main())
