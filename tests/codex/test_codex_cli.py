"""The real, pinned Codex CLIs (each of `CODEX_PINS`: the long-pinned one and the newest beside
it) run one `codex exec` turn against the running facade (fixture model).

Pass: the turn completes, or fails only with Codex's `Incomplete response returned, reason:
max_output_tokens` (a tiny random model may run out of tokens). Any other error — a 4xx/5xx, a
stream Codex cannot parse, a stream without a terminal event, an idle timeout — fails the test.
Skipped only where node or the npm-installed CLI is missing, and never under CI (CI=true).
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest

from tests._services import free_port
from tests.codex.codex_cli import (
    CODEX_PINS,
    INCOMPLETE_MAX_OUTPUT,
    CodexPin,
    codex_unavailable_reason,
    codex_version,
    loopback_only_env,
    run_codex_exec,
    write_config,
)
from tests.codex.codex_requests import screenshot_png

# Bounds the whole run: a ~9k-token prompt prefills in seconds on the fixture model, and the
# engine's output cap bounds decode. Codex's own idle timer must outlast the slowest prefill.
CODEX_TIMEOUT_S = 240
IDLE_TIMEOUT_MS = 200_000

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]


@pytest.fixture(scope="module", params=CODEX_PINS, ids=lambda pin: pin.version)
def codex_pin(request: pytest.FixtureRequest) -> CodexPin:
    pin: CodexPin = request.param
    return pin


@pytest.fixture(scope="module")
def codex_env(
    tmp_path_factory: pytest.TempPathFactory, facade_url: str, codex_pin: CodexPin
) -> tuple[dict[str, str], Path]:
    reason = codex_unavailable_reason(codex_pin.bin)
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"Codex CLI must run in CI: {reason}")
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("codex")
    codex_home = root / "codex-home"
    write_config(codex_home, f"{facade_url}/v1", model="default", idle_timeout_ms=IDLE_TIMEOUT_MS)
    workdir = root / "project"
    workdir.mkdir()
    (workdir / "screenshot.png").write_bytes(screenshot_png())
    return loopback_only_env(codex_home, dead_port=free_port()), workdir


def test_pinned_codex_version(codex_env: tuple[dict[str, str], Path], codex_pin: CodexPin) -> None:
    env, _ = codex_env
    assert codex_version(env, codex_pin.bin) == f"codex-cli {codex_pin.version}"


def test_codex_exec_turn_ends_without_protocol_error(
    codex_env: tuple[dict[str, str], Path], codex_pin: CodexPin
) -> None:
    env, workdir = codex_env
    run = run_codex_exec(
        "Use view_image on screenshot.png and say what shapes it shows.",
        workdir,
        env,
        CODEX_TIMEOUT_S,
        codex_bin=codex_pin.bin,
    )
    assert not run.protocol_problems(), run.describe()
    result = run.turn_results()[0]
    if result["type"] == "turn.completed":
        # Usage reached Codex from response.completed.
        assert result["usage"]["input_tokens"] > 0, run.describe()
    else:
        assert result["error"]["message"] == INCOMPLETE_MAX_OUTPUT, run.describe()


ANSWER_SCHEMA = {
    "type": "object",
    "properties": {
        "shapes": {"type": "array", "items": {"type": "string"}},
        "count": {"type": "integer"},
    },
    "required": ["shapes", "count"],
    "additionalProperties": False,
}


def test_codex_exec_output_schema_gives_json_valid_against_it(
    codex_env: tuple[dict[str, str], Path], codex_pin: CodexPin, tmp_path: Path
) -> None:
    env, workdir = codex_env
    schema_path = tmp_path / "schema.json"
    schema_path.write_text(json.dumps(ANSWER_SCHEMA))
    last_message = tmp_path / "last-message.txt"
    run = run_codex_exec(
        "List the shapes you can think of and how many there are.",
        workdir,
        env,
        CODEX_TIMEOUT_S,
        options=("--output-schema", str(schema_path), "--output-last-message", str(last_message)),
        codex_bin=codex_pin.bin,
    )
    assert not run.protocol_problems(), run.describe()
    assert run.turn_results()[0]["type"] == "turn.completed", run.describe()
    jsonschema.validate(json.loads(last_message.read_text()), ANSWER_SCHEMA)
