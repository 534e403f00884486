"""`python -m vlmserve.facade.launch` starts engine and facade, serves, and stops both on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests._services import REPO, free_port


def listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_launcher_runs_engine_and_facade_and_stops_both(tmp_path: Path) -> None:
    port, engine_port = free_port(), free_port()
    command = [
        sys.executable,
        "-m",
        "vlmserve.facade.launch",
        *("--engine-command", f"{sys.executable} -m tests.facade.fake_engine_server"),
        *("--engine-address", f"127.0.0.1:{engine_port}"),
        *("--port", str(port), "--store-path", str(tmp_path / "store.sqlite3")),
        *("--log-level", "warning"),
    ]
    launcher = subprocess.Popen(command, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO)))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1)
                if ready.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert launcher.poll() is None, "launcher exited early"
            assert time.monotonic() < deadline, "facade never became ready"
            time.sleep(0.2)
        answer = httpx.post(f"http://127.0.0.1:{port}/v1/responses", json={"input": "hi"}, timeout=10)
        assert answer.json()["output"][0]["content"][0]["text"] == "Hello, world."
        assert listening(engine_port) and listening(port)
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=30) == 0
        # Both children were stopped before the launcher returned: nothing listens any more.
        assert not listening(port) and not listening(engine_port)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()
