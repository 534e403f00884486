"""`--log-format json` on the real engine and facade processes: every line one JSON object, and a
request's lines carry its ids (facade: request_id + response_id; engine: the request id the
facade sends, which is the response id)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests._fixture_models import RANDOM_MODEL_PATH
from tests._services import ServiceProcess, start_engine, start_facade

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]


@pytest.fixture(scope="module")
def stack(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ServiceProcess, ServiceProcess]]:
    logs = tmp_path_factory.mktemp("json-logs")
    engine = start_engine(logs, model=str(RANDOM_MODEL_PATH), extra=("--log-format", "json"))
    try:
        facade = start_facade(
            logs, engine.address, store_path=logs / "store.sqlite3", extra=("--log-format", "json")
        )
        try:
            yield engine, facade
        finally:
            facade.stop()
    finally:
        engine.stop()


def json_lines(log_path: Path) -> list[dict[str, object]]:
    lines = [line for line in log_path.read_text().splitlines() if line.strip()]
    parsed = []
    for line in lines:
        try:
            parsed.append(json.loads(line))
        except json.JSONDecodeError:
            pytest.fail(f"not a JSON line in {log_path.name}: {line!r}")
    return parsed


def test_a_responses_request_is_traceable_through_both_logs(
    stack: tuple[ServiceProcess, ServiceProcess],
) -> None:
    engine, facade = stack
    answer = httpx.post(
        f"{facade.address}/v1/responses",
        json={"model": "default", "input": "hello", "max_output_tokens": 4},
        timeout=60,
    )
    assert answer.status_code == 200, answer.text
    request_id, response_id = answer.headers["x-request-id"], answer.json()["id"]
    facade.stop()
    engine.stop()  # flushes both logs

    facade_lines = json_lines(facade.log_path)
    access = [line for line in facade_lines if "POST /v1/responses" in str(line["message"])]
    assert len(access) == 1, facade_lines
    assert access[0]["request_id"] == request_id
    assert access[0]["response_id"] == response_id
    assert {"time", "level", "logger"} <= access[0].keys()

    engine_lines = json_lines(engine.log_path)
    finished = [line for line in engine_lines if line.get("request_id") == response_id]
    assert finished, engine_lines
    assert "generated=4" in str(finished[-1]["message"])
