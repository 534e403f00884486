"""Start the real engine and facade as processes on loopback, for tests that need them."""

from __future__ import annotations

import os
import re
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests import _marker_guard

REPO = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
OPENBLAS = next(iter(sorted(Path("/usr/lib").glob("*/openblas-pthread/libblas.so.3"))), None)
# A log line healthy traffic must never leave: an error, a traceback, a task nobody awaited.
ERROR_LINE = re.compile(r"\b(ERROR|CRITICAL)\b|Traceback|exception was never retrieved")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def process_env() -> dict[str, str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    if OPENBLAS is not None and "openblas" not in env.get("LD_PRELOAD", ""):
        env["LD_PRELOAD"] = f"{OPENBLAS} {env.get('LD_PRELOAD', '')}".strip()
    return env


@dataclass
class ServiceProcess:
    process: subprocess.Popen[bytes]
    address: str
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def error_lines(self) -> list[str]:
        """The lines of its log that healthy traffic must never leave (`ERROR_LINE`)."""
        return [line for line in self.log().splitlines() if ERROR_LINE.search(line)]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_engine(
    log_dir: Path,
    *,
    model: str | None = None,
    address: str | None = None,
    extra: tuple[str, ...] = (),
    env: Mapping[str, str] | None = None,
    bin_dir: Path = BIN,
) -> ServiceProcess:
    """`vlmserve-engine` on `address` (a free loopback port by default), once it reports SERVING.

    `env`: variables added to the process's environment. `bin_dir`: another checkout's venv bin
    (bench/peers.py `--baseline-tree`: the same stack at another commit)."""
    from vlmserve.client import EngineClient

    _marker_guard.check("starts an engine process")
    address = address or f"127.0.0.1:{free_port()}"
    log_path = log_dir / f"engine-{address.replace(':', '_')}-{time.monotonic_ns()}.log"
    command = [str(bin_dir / "vlmserve-engine"), "--address", address, *extra]
    if model := model or os.environ.get("VLMSERVE_TEST_MODEL"):
        command += ["--model", model]
    with log_path.open("wb") as log:
        process = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**process_env(), **(env or {})}, cwd=REPO
        )
    service = ServiceProcess(process, address, log_path)
    with EngineClient(address) as client:
        deadline = time.monotonic() + 120
        while not client.health():
            if process.poll() is not None or time.monotonic() > deadline:
                service.stop()
                raise RuntimeError(f"engine did not become ready:\n{service.log()[-4000:]}")
            time.sleep(0.1)
    return service


def start_fake_engine(log_dir: Path, *, chunks: int, delay_s: float) -> ServiceProcess:
    """The tests' scripted engine (tests/facade/fake_engine_server.py) as a process on a free
    loopback port: every answer is `chunks` text chunks, `delay_s` apart. Not waited for: a
    facade started on it waits for it to serve."""
    address = f"127.0.0.1:{free_port()}"
    log_path = log_dir / f"fake-engine-{address.replace(':', '_')}.log"
    command = [
        sys.executable,
        *("-m", "tests.facade.fake_engine_server", "--address", address),
        *("--chunks", str(chunks), "--delay-s", str(delay_s)),
    ]
    env = dict(process_env(), PYTHONPATH=str(REPO))
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO)
    return ServiceProcess(process, address, log_path)


def start_facade(
    log_dir: Path,
    engine_address: str,
    *,
    store_path: Path,
    extra: tuple[str, ...] = (),
    bin_dir: Path = BIN,
) -> ServiceProcess:
    _marker_guard.check("starts a facade process")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = log_dir / f"facade-{port}.log"
    command = [
        str(bin_dir / "vlmserve-facade"),
        *("--engine-address", engine_address),
        *("--host", "127.0.0.1", "--port", str(port)),
        *("--store-path", str(store_path)),
        *extra,
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=process_env(), cwd=REPO)
    service = ServiceProcess(process, url, log_path)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/readyz", timeout=2).status_code == 200:
                return service
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            service.stop()
            raise RuntimeError(f"facade did not become ready:\n{service.log()[-4000:]}")
        time.sleep(0.2)


def have_codex() -> bool:
    return shutil.which("node") is not None and (REPO / "node_modules" / ".bin" / "codex").exists()
