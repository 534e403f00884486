"""Several engines behind one facade (`--engine-address a,b`): gRPC's round_robin spreads the
requests over both (counted from each engine's own /metrics); an engine SIGKILLed mid-run costs
no request a hang or a 500 (each completes, or fails cleanly with `response.failed`); new
requests reach the survivor; the killed engine, restarted, rejoins."""

from __future__ import annotations

import concurrent.futures
import time
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests._fixture_models import RANDOM_MODEL_PATH
from tests._services import ServiceProcess, free_port, start_engine, start_facade
from tests._sse import iter_lines

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]


def generated(metrics_port: int) -> float:
    """Generate requests this engine finished, any outcome (0 when it is down)."""
    try:
        text = httpx.get(f"http://127.0.0.1:{metrics_port}/metrics", timeout=5).text
    except httpx.HTTPError:
        return 0.0
    return sum(
        sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == "vlmserve_engine_requests_total" and sample.labels.get("kind") == "generate"
    )


def engine_on(tmp_path: Path, port: int, metrics_port: int) -> ServiceProcess:
    return start_engine(
        tmp_path,
        model=str(RANDOM_MODEL_PATH),
        address=f"127.0.0.1:{port}",
        extra=("--metrics-port", str(metrics_port), "--max-tokens", "256"),
    )


def create(url: str, text: str, max_output_tokens: int = 8) -> httpx.Response:
    body = {"model": "default", "input": text, "max_output_tokens": max_output_tokens, "store": False}
    return httpx.post(f"{url}/v1/responses", json=body, timeout=120)


def stream(url: str, text: str) -> str:
    """A streamed response's final event type (or what else ended it)."""
    body = {"model": "default", "input": text, "max_output_tokens": 200, "stream": True, "store": False}
    with httpx.stream("POST", f"{url}/v1/responses", json=body, timeout=120) as response:
        if response.status_code != 200:
            return f"http {response.status_code}"
        last = "none"
        for line in iter_lines(response):
            if line.startswith("event: "):
                last = line.removeprefix("event: ")
        return last


def test_two_engines_share_the_load_and_survive_losing_one(tmp_path: Path) -> None:
    ports = [free_port(), free_port()]
    metrics = [free_port(), free_port()]
    engines = [engine_on(tmp_path, ports[i], metrics[i]) for i in range(2)]
    facade = start_facade(
        tmp_path,
        ",".join(f"127.0.0.1:{port}" for port in ports),
        store_path=tmp_path / "store.db",
    )
    try:
        pool = concurrent.futures.ThreadPoolExecutor(8)
        # 64 requests, 8 at a time: both engines get a share.
        answers = list(pool.map(lambda i: create(facade.address, f"Request {i}."), range(64)))
        assert [a.status_code for a in answers] == [200] * 64
        assert all(a.json()["status"] in ("completed", "incomplete") for a in answers)
        counts = [generated(port) for port in metrics]
        assert sum(counts) == 64
        assert min(counts) >= 16, f"round_robin should spread the requests: {counts}"

        # SIGKILL engine 0 while 16 long streams run over both.
        running = [pool.submit(stream, facade.address, f"Tell a long story {i}.") for i in range(16)]
        time.sleep(1.0)
        engines[0].process.kill()
        engines[0].process.wait()
        endings = [future.result(timeout=180) for future in running]
        # Each stream ended with a terminal event: never a hang, a 500 or a cut stream.
        assert set(endings) <= {"response.completed", "response.incomplete", "response.failed"}, endings
        assert "response.completed" in endings or "response.incomplete" in endings

        # New requests all reach the survivor.
        before = generated(metrics[1])
        answers = list(pool.map(lambda i: create(facade.address, f"After {i}."), range(8)))
        assert [a.status_code for a in answers] == [200] * 8
        assert generated(metrics[1]) - before == 8

        # Restarted on its port, engine 0 rejoins: gRPC reconnects and health turns it SERVING.
        engines[0] = engine_on(tmp_path, ports[0], metrics[0])
        deadline = time.monotonic() + 60
        while generated(metrics[0]) == 0:
            assert time.monotonic() < deadline, "the restarted engine got no requests"
            assert create(facade.address, "Back?").status_code == 200
        pool.shutdown()
    finally:
        facade.stop()
        for engine in engines:
            engine.stop()
