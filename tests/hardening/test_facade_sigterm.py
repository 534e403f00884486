"""SIGTERM on a real `vlmserve-facade` process: it stops accepting connections at once, lets
in-flight requests finish within the grace period, and ends streams that outlast it cleanly."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests._services import BIN, REPO, ServiceProcess, free_port, process_env, start_fake_engine
from tests._sse import iter_lines

pytestmark = pytest.mark.needs_model

CHUNKS = 30
CHUNK_DELAY_S = 0.1  # every answer streams for about 3 s


@pytest.fixture(scope="module")
def engine_address(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    engine = start_fake_engine(tmp_path_factory.mktemp("engine"), chunks=CHUNKS, delay_s=CHUNK_DELAY_S)
    try:
        yield engine.address
    finally:
        engine.stop()


def start_facade(tmp_path: Path, engine_address: str, grace_s: float) -> tuple[ServiceProcess, int]:
    port = free_port()
    log_path = tmp_path / "facade.log"
    command = [
        str(BIN / "vlmserve-facade"),
        *("--engine-address", engine_address, "--port", str(port)),
        *("--store-path", str(tmp_path / "store.sqlite3"), "--shutdown-grace", str(grace_s)),
    ]
    with log_path.open("wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=process_env(), cwd=REPO)
    facade = ServiceProcess(process, f"http://127.0.0.1:{port}", log_path)
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{facade.address}/readyz", timeout=2).status_code == 200:
                return facade, port
        except httpx.HTTPError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            facade.stop()
            raise RuntimeError(f"facade did not become ready:\n{facade.log()[-3000:]}")
        time.sleep(0.1)


@dataclass
class StreamReader:
    """Reads one streamed response in a thread; `first_delta` is set when text starts."""

    url: str
    events: list[Any] = field(default_factory=list)
    first_delta: threading.Event = field(default_factory=threading.Event)
    error: BaseException | None = None

    def start(self) -> threading.Thread:
        thread = threading.Thread(target=self._run, daemon=True)
        thread.start()
        return thread

    def _run(self) -> None:
        body = {"input": "hi", "stream": True}
        try:
            with httpx.stream("POST", f"{self.url}/v1/responses", json=body, timeout=30) as reply:
                for line in iter_lines(reply):
                    if not line.startswith("data:"):
                        continue
                    data = line.removeprefix("data:").strip()
                    self.events.append(data if data == "[DONE]" else json.loads(data))
                    if '"response.output_text.delta"' in line:
                        self.first_delta.set()
        except BaseException as error:
            self.error = error
            self.first_delta.set()


def refuses_connections(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) != 0


def wait_until(check: Any, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return False


def stop_and_reap(facade: ServiceProcess) -> int:
    try:
        return facade.process.wait(timeout=30)
    finally:
        facade.stop()


@pytest.mark.slow
def test_in_flight_requests_finish_after_sigterm_and_new_ones_are_refused(
    tmp_path: Path, engine_address: str
) -> None:
    facade, port = start_facade(tmp_path, engine_address, grace_s=15)
    stream = StreamReader(facade.address)
    stream_thread = stream.start()
    assert stream.first_delta.wait(10) and stream.error is None
    plain: dict[str, Any] = {}
    plain_thread = threading.Thread(
        target=lambda: plain.update(
            reply=httpx.post(f"{facade.address}/v1/responses", json={"input": "hi"}, timeout=30)
        ),
        daemon=True,
    )
    plain_thread.start()
    time.sleep(0.3)  # the plain request is in flight too
    signalled = time.monotonic()
    facade.process.send_signal(signal.SIGTERM)
    assert wait_until(lambda: refuses_connections(port), 3.0), "still accepting connections after SIGTERM"
    refused_after = time.monotonic() - signalled
    print(f"connections refused {refused_after:.2f} s after SIGTERM")
    stream_thread.join(30)
    plain_thread.join(30)
    returncode = stop_and_reap(facade)

    assert stream.error is None, repr(stream.error)
    assert stream.events[-1] == "[DONE]"
    final = stream.events[-2]
    assert final["type"] == "response.completed", final["type"]
    text = final["response"]["output"][0]["content"][0]["text"]
    assert text == "".join(f"t{index} " for index in range(CHUNKS))
    assert plain["reply"].status_code == 200
    assert plain["reply"].json()["status"] == "completed"
    assert returncode in (0, -signal.SIGTERM), facade.log()[-2000:]
    assert refused_after < 3.0


@pytest.mark.slow
def test_a_stream_that_outlasts_the_grace_period_ends_cleanly(tmp_path: Path, engine_address: str) -> None:
    facade, _ = start_facade(tmp_path, engine_address, grace_s=0.3)
    stream = StreamReader(facade.address)
    thread = stream.start()
    assert stream.first_delta.wait(10) and stream.error is None
    facade.process.send_signal(signal.SIGTERM)
    thread.join(30)
    returncode = stop_and_reap(facade)
    assert stream.error is None, repr(stream.error)
    assert stream.events[-1] == "[DONE]"
    final = stream.events[-2]
    assert (final["type"], final["response"]["status"]) == ("response.incomplete", "cancelled")
    assert len(final["response"]["output"][0]["content"][0]["text"].split()) < CHUNKS
    assert returncode in (0, -signal.SIGTERM), facade.log()[-2000:]
    assert os.path.exists(tmp_path / "store.sqlite3")
