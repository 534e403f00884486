"""`python -m vlmserve.facade.launch` (what `make run` runs) starts engine and facade, serves, and
stops both on every path: SIGTERM (also twice, to `make run`'s whole process group, with a stream
running), and its own SIGKILL."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests._services import REPO, free_port
from vlmserve.facade.store.repositories import Store

pytestmark = pytest.mark.needs_model

FAKE_ENGINE = f"{sys.executable} -m tests.facade.fake_engine_server"


def listening(port: int) -> bool:
    with socket.socket() as probe:
        probe.settimeout(1)
        return probe.connect_ex(("127.0.0.1", port)) == 0


def wait_ready(process: subprocess.Popen[bytes], port: int) -> None:
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert process.poll() is None, "launcher exited early"
        assert time.monotonic() < deadline, "facade never became ready"
        time.sleep(0.2)


def wait_closed(*ports: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(listening(port) for port in ports):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.2)
    return True


def env() -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(REPO))


@pytest.mark.slow
def test_launcher_runs_engine_and_facade_and_stops_both(tmp_path: Path) -> None:
    port, engine_port = free_port(), free_port()
    command = [
        sys.executable,
        "-m",
        "vlmserve.facade.launch",
        *("--engine-command", FAKE_ENGINE),
        *("--engine-address", f"127.0.0.1:{engine_port}"),
        *("--port", str(port), "--store-path", str(tmp_path / "store.sqlite3")),
        *("--log-level", "warning"),
    ]
    launcher = subprocess.Popen(command, cwd=REPO, env=env())
    try:
        wait_ready(launcher, port)
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


def _stream(port: int, lines: list[str], first_delta: threading.Event) -> None:
    body = {"input": "hi", "stream": True}
    with httpx.stream("POST", f"http://127.0.0.1:{port}/v1/responses", json=body, timeout=60) as reply:
        for line in reply.iter_lines():
            lines.append(line)
            if "response.output_text.delta" in line:
                first_delta.set()
    first_delta.set()


@pytest.mark.slow
def test_make_run_stops_cleanly_when_its_process_group_gets_sigterm(tmp_path: Path) -> None:
    """A stream still running when `make run` is stopped ends with its final event and
    [DONE] and is stored finished, because the launcher waits as long as the facade's own
    shutdown takes (all from --shutdown-grace); a second SIGTERM (make passes its own on) changes
    nothing; the launcher exits and leaves no child running."""
    port, engine_port = free_port(), free_port()
    store_path = tmp_path / "store.sqlite3"
    slow_engine = f"{FAKE_ENGINE} --chunks 600 --delay-s 0.05"  # a 30 s answer
    make = subprocess.Popen(
        [
            *("make", "--no-print-directory", "-o", ".venv/.installed-stamp", "run"),
            f"ENGINE_ADDR=127.0.0.1:{engine_port}",
            f"FACADE_PORT={port}",
            f"RUN_ARGS=--engine-command '{slow_engine}' --shutdown-grace 2 --store-path {store_path}",
        ],
        cwd=REPO,
        env=env(),
        start_new_session=True,  # its own process group, as a terminal or a supervisor gives it
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
    )
    output: list[bytes] = []
    reader = threading.Thread(target=lambda: output.extend(make.stdout or ()), daemon=True)
    reader.start()
    try:
        wait_ready(make, port)
        lines: list[str] = []
        first_delta = threading.Event()
        client = threading.Thread(target=_stream, args=(port, lines, first_delta), daemon=True)
        client.start()
        assert first_delta.wait(20), lines
        os.killpg(make.pid, signal.SIGTERM)
        time.sleep(0.1)
        os.killpg(make.pid, signal.SIGTERM)
        client.join(30)
        assert not client.is_alive(), "the stream did not end"
        lines = [line for line in lines if line]
        assert lines[-1] == "data: [DONE]", lines[-6:]
        events = [json.loads(line[6:]) for line in lines if line.startswith("data: {")]
        final = events[-1]
        assert final["type"] in ("response.incomplete", "response.completed"), final["type"]
        make.wait(timeout=60)
        assert wait_closed(port, engine_port, timeout=10), "a child is still listening"
    finally:
        if make.poll() is None:
            os.killpg(make.pid, signal.SIGKILL)
            make.wait()
    reader.join(10)
    log = b"".join(output).decode(errors="replace")
    assert log.count("; stopping") == 1, log[-3000:]
    assert "killing it" not in log and "INFO vlmserve.launch: stopped" in log, log[-3000:]
    store = Store.sqlite(store_path)
    try:
        stored = asyncio.run(store.responses.get(final["response"]["id"], owner="anonymous"))
    finally:
        store.close()
    assert stored is not None and stored.status == final["response"]["status"] != "in_progress"


@pytest.mark.slow
def test_children_stop_when_the_launcher_is_killed(tmp_path: Path) -> None:
    """SIGKILL leaves the launcher no chance to stop anything: its children, in sessions of their
    own, see their lifeline close and stop themselves."""
    port, engine_port = free_port(), free_port()
    command = [
        sys.executable,
        "-m",
        "vlmserve.facade.launch",
        *("--engine-command", FAKE_ENGINE, "--engine-address", f"127.0.0.1:{engine_port}"),
        *("--port", str(port), "--store-path", str(tmp_path / "store.sqlite3"), "--log-level", "warning"),
    ]
    launcher = subprocess.Popen(command, cwd=REPO, env=env())
    try:
        wait_ready(launcher, port)
        launcher.kill()
        launcher.wait()
        assert wait_closed(port, engine_port, timeout=30), "the children outlived the launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


@pytest.mark.slow
def test_with_api_keys_the_launcher_locks_the_engine_with_a_token(tmp_path: Path) -> None:
    """With API keys on the facade, `make run`'s engine is not open on loopback.
    The launcher makes a token for the run; the facade's requests get through, while Generate,
    Abort and reflection without it are refused (health stays open for probes)."""
    import grpc
    from grpc_health.v1 import health_pb2, health_pb2_grpc
    from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

    from vlmserve.engine.v1 import engine_pb2 as pb
    from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

    key = "sk-launcher-test-key-0123456789"
    authorization = {"Authorization": f"Bearer {key}"}
    port, engine_port = free_port(), free_port()
    command = [
        sys.executable,
        "-m",
        "vlmserve.facade.launch",
        *("--model", str(REPO / "models" / "qwen2-vl-tiny"), "--engine-address", f"127.0.0.1:{engine_port}"),
        *("--port", str(port), "--store-path", str(tmp_path / "store.sqlite3"), "--log-level", "warning"),
    ]
    environ = {name: value for name, value in env().items() if name != "VLMSERVE_ENGINE_TOKEN"}
    launcher = subprocess.Popen(command, cwd=REPO, env={**environ, "VLMSERVE_API_KEYS": key})
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                ready = httpx.get(f"http://127.0.0.1:{port}/readyz", headers=authorization)
                if ready.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert launcher.poll() is None and time.monotonic() < deadline, "never ready"
            time.sleep(0.3)
        body = {"input": "hi", "max_output_tokens": 2}
        answer = httpx.post(
            f"http://127.0.0.1:{port}/v1/responses",
            json=body,
            headers=authorization,
            timeout=60,
        )
        assert answer.status_code == 200, answer.text
        with grpc.insecure_channel(f"127.0.0.1:{engine_port}") as channel:
            engine = pb_grpc.EngineServiceStub(channel)
            calls = {
                "Generate": lambda: list(engine.Generate(pb.GenerateRequest(), timeout=10)),
                "Abort": lambda: engine.Abort(pb.AbortRequest(request_id="resp_x"), timeout=10),
                "GetModelInfo": lambda: engine.GetModelInfo(pb.GetModelInfoRequest(), timeout=10),
                "reflection": lambda: list(
                    reflection_pb2_grpc.ServerReflectionStub(channel).ServerReflectionInfo(
                        iter([reflection_pb2.ServerReflectionRequest(list_services="")]), timeout=10
                    )
                ),
            }
            for name, call in calls.items():
                with pytest.raises(grpc.RpcError) as refused:
                    call()
                assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED, name
            health = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
            assert health.status == health_pb2.HealthCheckResponse.SERVING
    finally:
        launcher.send_signal(signal.SIGTERM)
        try:
            launcher.wait(timeout=60)
        finally:
            if launcher.poll() is None:
                launcher.kill()
                launcher.wait()


@pytest.mark.slow
def test_several_models_one_engine_each(tmp_path: Path) -> None:
    """`make run MODELS=a=...,b=...`: an engine per model on consecutive ports, the facade routing
    by id; SIGTERM stops all three."""
    port, engine_port = free_port(), free_port()
    while listening(engine_port + 1):
        engine_port = free_port()
    command = [
        sys.executable,
        "-m",
        "vlmserve.facade.launch",
        *("--engine-command", FAKE_ENGINE),
        *("--engine-address", f"127.0.0.1:{engine_port}"),
        *("--models", "alpha=models/alpha,beta=models/beta"),
        *("--port", str(port), "--store-path", str(tmp_path / "store.sqlite3")),
        *("--log-level", "warning"),
    ]
    launcher = subprocess.Popen(command, cwd=REPO, env=env())
    try:
        wait_ready(launcher, port)
        url = f"http://127.0.0.1:{port}"
        listed = httpx.get(f"{url}/v1/models", timeout=10).json()["data"]
        assert [(model["id"], model["vlmserve"]["engine_model"]) for model in listed] == [
            ("alpha", "models/alpha"),
            ("beta", "models/beta"),
        ]
        for name, served in (("beta", "beta"), ("default", "alpha")):
            answer = httpx.post(f"{url}/v1/responses", json={"model": name, "input": "hi"}, timeout=10)
            assert answer.json()["model"] == served
        assert listening(engine_port) and listening(engine_port + 1)
        launcher.send_signal(signal.SIGTERM)
        assert launcher.wait(timeout=30) == 0
        assert not listening(port) and not listening(engine_port) and not listening(engine_port + 1)
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


def test_a_stop_signal_takes_no_lock() -> None:
    """The handler runs between two bytecodes of the main thread, which may hold a lock at that
    moment (a threading.Event's, inside its wait): a handler that takes a lock can wait on it for
    ever. An Event.set() there hung the launcher on SIGTERM now and then (seen in CI: the stream
    ran on, the children stayed up). Recorded with a profiler: it calls nothing that locks."""
    from vlmserve.facade.launch import Launcher

    launcher = Launcher.__new__(Launcher)  # only the signal state; nothing started
    launcher._signals = []
    called: list[str] = []

    def record(frame: object, event: str, arg: object) -> None:
        if event == "c_call":
            called.append(getattr(arg, "__qualname__", repr(arg)))
        elif event == "call":
            called.append(frame.f_code.co_qualname)  # type: ignore[attr-defined]

    sys.setprofile(record)
    try:
        launcher.handle_signal(signal.SIGTERM, None)
        launcher.handle_signal(signal.SIGTERM, None)
    finally:
        sys.setprofile(None)
    assert launcher.stopping
    locking = [
        name for name in called if any(word in name for word in ("acquire", "Event", "Condition", "Lock"))
    ]
    assert locking == [], called
