"""The model's life in a real engine process (model_lifecycle.py): `--load lazy` serves before the
weights are read and the first requests load them (waiting meanwhile, one load for all);
`--idle-unload-seconds` frees them after idling, and the next request reads them again and
generates the very same tokens; metrics and logs say so."""

from __future__ import annotations

import concurrent.futures
import re
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests._fixture_models import RANDOM_MODEL_PATH
from tests._prometheus import metric_samples
from tests._services import ServiceProcess, free_port, start_engine
from vlmserve.client import EngineClient
from vlmserve.engine.v1 import engine_pb2 as pb

pytestmark = pytest.mark.slow

IDLE_S = 1.5


def request(text: str) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        messages=[pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text=text))])],
        sampling=pb.SamplingParams(max_tokens=16, temperature=0.0, logprobs=True),
    )


def tokens(result: pb.GenerateResult) -> list[tuple[str, float]]:
    return [(entry.token, round(entry.logprob, 4)) for entry in result.logprobs]


def metrics(port: int) -> dict[str, float]:
    return metric_samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=5).text)


def wait_for(condition: object, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.1)


@pytest.fixture(scope="module")
def lazy_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, int]]:
    metrics_port = free_port()
    engine = start_engine(
        tmp_path_factory.mktemp("lifecycle"),
        model=str(RANDOM_MODEL_PATH),
        extra=(
            "--load",
            "lazy",
            "--idle-unload-seconds",
            str(IDLE_S),
            "--metrics-port",
            str(metrics_port),
        ),
    )
    yield engine, metrics_port
    engine.stop()


def test_lazy_load_idle_unload_and_reload(lazy_engine: tuple[ServiceProcess, int], tmp_path: Path) -> None:
    engine, metrics_port = lazy_engine
    with EngineClient(engine.address) as client:
        # SERVING without weights: the model is described, nothing is loaded yet.
        assert client.health()
        info = client.model_info()
        assert info.weights == pb.WEIGHTS_STATE_UNLOADED
        assert info.context_length > 0 and info.model_id == RANDOM_MODEL_PATH.name
        assert metrics(metrics_port)["vlmserve_engine_weights_loaded"] == 0
        assert metrics(metrics_port).get("vlmserve_engine_model_loads_total", 0) == 0
        # Counting tokens needs no weights.
        assert client.count_tokens(request("count me")).input_tokens > 0
        assert client.model_info().weights == pb.WEIGHTS_STATE_UNLOADED

        # Three requests at once: they wait for one load, then all run.
        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            first = list(pool.map(lambda text: client.generate_unary(request(text)), ["a", "b", "c"]))
        assert all(len(result.logprobs) == 16 for result in first)
        after_load = metrics(metrics_port)
        assert after_load["vlmserve_engine_model_loads_total"] == 1
        assert after_load["vlmserve_engine_model_load_seconds_count"] == 1
        assert client.model_info().weights == pb.WEIGHTS_STATE_LOADED
        assert client.model_info().loaded_at > 0

        # Idle: the weights and caches go.
        wait_for(lambda: client.model_info().weights == pb.WEIGHTS_STATE_UNLOADED, timeout=IDLE_S + 20)
        unloaded = metrics(metrics_port)
        assert unloaded["vlmserve_engine_model_unloads_total"] == 1
        assert unloaded["vlmserve_engine_weights_loaded"] == 0
        assert client.health()  # still SERVING: a request is what loads them
        # The memory really went back: MLX's active memory after the unload is a small part of
        # what it was (the weights and caches; what stays is the tokenizer side's few arrays).
        (before, after) = re.findall(r"MLX active ([\d.]+) MiB", engine.log().split("weights unloaded")[1])[
            :2
        ]
        assert float(after) < 0.1 * float(before), (before, after)

        # The next request reads them again and makes the same tokens.
        again = client.generate_unary(request("a"))
        assert tokens(again) == tokens(first[0]) and again.text == first[0].text
        reloaded = metrics(metrics_port)
        assert reloaded["vlmserve_engine_model_loads_total"] == 2
        assert client.model_info().weights == pb.WEIGHTS_STATE_LOADED
