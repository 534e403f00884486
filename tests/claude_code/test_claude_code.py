"""Claude Code (npm `@anthropic-ai/claude-code`, pinned: the long-pinned version and the newest
beside it, the npm alias `claude-code-new`) against the real facade and engine.

* `claude -p` headless, `ANTHROPIC_BASE_URL` at the facade: a turn completes (Claude Code parses
  our stream to its end; any 4xx/5xx or a stream it cannot read makes `is_error`).
* Its real recorded requests (tests/claude_code/data, recorded with record_claude_requests.py:
  turn 1, and turn 2 carrying its Read tool's tool_result of screenshot.png, an image block),
  replayed with fresh images: the engine receives each image (a recording gRPC hop between facade
  and engine), lowered into the user turn after the tool turn, and the stream is one the
  `anthropic` SDK's event models accept.
* Its full default-tools first request translates (no refusal of anything it sends).

Skipped only where node or the npm-installed CLI is missing, and never under CI.
"""

from __future__ import annotations

import base64
import copy
import json
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from anthropic.types import RawMessageStreamEvent
from pydantic import TypeAdapter

from tests._engine_recorder import EngineRecorder
from tests._services import REPO, ServiceProcess, free_port
from tests.facade.helpers import parse_sse
from training.squares import make_samples
from vlmserve.anthropic import messages_request
from vlmserve.engine.prep.lowering import IMAGE_FOLLOW_UP_MARKER, lower_messages
from vlmserve.engine.v1 import engine_pb2 as pb

CLAUDE_BIN = REPO / "node_modules" / ".bin" / "claude"
PINNED_VERSION = "2.1.328"


@dataclass(frozen=True)
class ClaudePin:
    version: str
    bin: Path


# Every pinned Claude Code: the tests that run it run each (ids: the versions). Its npm package
# holds a native binary (no node needed to run it, whatever its `engines` says); two versions of
# one package cannot share its name in node_modules, so the newest is an npm alias.
CLAUDE_PINS = (
    ClaudePin(PINNED_VERSION, CLAUDE_BIN),
    ClaudePin("2.1.332", REPO / "node_modules" / "claude-code-new" / "bin" / "claude.exe"),
)
DATA = Path(__file__).parent / "data"
# A ~3.3k-token prompt (Read as the only tool) prefills in seconds; the engine's output cap
# bounds decode.
CLAUDE_TIMEOUT_S = 300
REPLAY_IMAGES = 5
REPLAY_MAX_TOKENS = 16
EVENTS: TypeAdapter[RawMessageStreamEvent] = TypeAdapter(RawMessageStreamEvent)

pytestmark = pytest.mark.slow


def load(name: str) -> dict[str, Any]:
    recorded: dict[str, Any] = json.loads((DATA / name).read_text())
    return recorded


def claude_unavailable_reason(claude_bin: Path = CLAUDE_BIN) -> str | None:
    if shutil.which("node") is None:
        return "node is not on PATH"
    if not claude_bin.exists():
        return f"{claude_bin} is missing: run `make node-deps` (npm ci installs @anthropic-ai/claude-code)"
    return None


def claude_env(home: Path, base_url: str) -> dict[str, str]:
    """Its own home, a dummy key, our model name for every model it uses, nothing beyond loopback."""
    proxy = f"http://127.0.0.1:{free_port()}"
    keep = ("PATH", "LANG", "LC_ALL", "TMPDIR", "USER", "LOGNAME")
    env = {name: os.environ[name] for name in keep if name in os.environ}
    env.update(
        HOME=str(home),
        ANTHROPIC_BASE_URL=base_url,
        ANTHROPIC_API_KEY="dummy-key",
        ANTHROPIC_MODEL="default",
        ANTHROPIC_DEFAULT_HAIKU_MODEL="default",
        ANTHROPIC_DEFAULT_SONNET_MODEL="default",
        ANTHROPIC_DEFAULT_OPUS_MODEL="default",
        ANTHROPIC_SMALL_FAST_MODEL="default",
        DISABLE_TELEMETRY="1",
        DISABLE_AUTOUPDATER="1",
        DISABLE_ERROR_REPORTING="1",
        CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC="1",
        HTTP_PROXY=proxy,
        HTTPS_PROXY=proxy,
        http_proxy=proxy,
        https_proxy=proxy,
        NO_PROXY="127.0.0.1,localhost",
        no_proxy="127.0.0.1,localhost",
    )
    return env


@pytest.fixture(scope="module", params=CLAUDE_PINS, ids=lambda pin: pin.version)
def claude_pin(request: pytest.FixtureRequest) -> ClaudePin:
    pin: ClaudePin = request.param
    return pin


@pytest.fixture(scope="module")
def claude(
    tmp_path_factory: pytest.TempPathFactory, facade_url: str, claude_pin: ClaudePin
) -> tuple[dict[str, str], Path]:
    reason = claude_unavailable_reason(claude_pin.bin)
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"Claude Code must run in CI: {reason}")
        pytest.skip(reason)
    root = tmp_path_factory.mktemp("claude-code")
    (root / "home").mkdir()
    (root / "project").mkdir()
    return claude_env(root / "home", facade_url), root / "project"


def test_pinned_claude_code_version(claude: tuple[dict[str, str], Path], claude_pin: ClaudePin) -> None:
    env, workdir = claude
    run = subprocess.run(
        [str(claude_pin.bin), "--version"], env=env, cwd=workdir, capture_output=True, timeout=60
    )
    assert run.stdout.decode().strip() == f"{claude_pin.version} (Claude Code)"


def test_claude_p_turn_completes(claude: tuple[dict[str, str], Path], claude_pin: ClaudePin) -> None:
    env, workdir = claude
    command = [str(claude_pin.bin), "-p", "Say hi.", "--tools", "Read", "--output-format", "json"]
    run = subprocess.run(command, env=env, cwd=workdir, capture_output=True, timeout=CLAUDE_TIMEOUT_S)
    described = f"rc={run.returncode}\nstdout={run.stdout[-3000:]!r}\nstderr={run.stderr[-3000:]!r}"
    assert run.returncode == 0, described
    result = json.loads(run.stdout)
    assert result["type"] == "result" and result["is_error"] is False, described
    assert result["terminal_reason"] == "completed" and result["stop_reason"] == "end_turn", described
    # The usage Claude Code read from our message_delta.
    assert result["usage"]["input_tokens"] + result["usage"]["cache_read_input_tokens"] > 1000, described
    assert result["result"], described


def test_its_full_default_request_translates() -> None:
    """The first request of `claude -p` with every default tool (recorded): nothing it sends is
    refused, every tool is offered, its mid-conversation system message stays a system turn."""
    body = load("claude_code_default_tools_turn1.json")["body"]
    translated = messages_request(body)
    items = translated.request.body.input
    assert [getattr(item, "role", None) for item in items] == ["system", "user", "system"]
    assert len(translated.request.body.tools or []) == len(body["tools"]) > 10
    assert translated.request.extras.enable_thinking is True  # thinking: adaptive
    assert translated.stream


def _replay(http: httpx.Client, body: dict[str, Any], headers: dict[str, str]) -> list[dict[str, Any]]:
    response = http.post("/v1/messages?beta=true", json=body, headers=headers)
    assert response.status_code == 200, response.text[:2000]
    events = parse_sse(response.text)
    payloads = [event.json() for event in events]
    for event, payload in zip(events, payloads, strict=True):
        assert event.event == payload["type"]
        if payload["type"] != "ping":  # the SDK skips pings; it has no model for them
            EVENTS.validate_python(payload)
    types = [payload["type"] for payload in payloads]
    assert types[0] == "message_start" and types[-2:] == ["message_delta", "message_stop"], types
    return payloads


def _recorded_headers(recorded: dict[str, Any]) -> dict[str, str]:
    wanted = (
        "anthropic-version",
        "anthropic-beta",
        "x-app",
        "user-agent",
        "anthropic-dangerous-direct-browser-access",
    )
    return {name: value for name, value in recorded["headers"].items() if name in wanted}


def test_recorded_turns_replayed_with_an_image_in_the_read_tool_result(
    recorded_facade: ServiceProcess, engine_recorder: EngineRecorder
) -> None:
    turn1, turn2 = load("claude_code_read_turn1.json"), load("claude_code_read_image_turn2.json")
    (result,) = [
        block
        for message in turn2["body"]["messages"]
        if isinstance(message["content"], list)
        for block in message["content"]
        if block["type"] == "tool_result"
    ]
    # What Claude Code's Read tool sends for a PNG: an image-only tool_result.
    assert [block["type"] for block in result["content"]] == ["image"]
    assert result["content"][0]["source"]["media_type"] == "image/png"
    with httpx.Client(base_url=recorded_facade.address, timeout=httpx.Timeout(300.0, connect=10.0)) as http:
        first = copy.deepcopy(turn1["body"])
        first["max_tokens"] = REPLAY_MAX_TOKENS
        _replay(http, first, _recorded_headers(turn1))
        for sample in make_samples(20_261_203, REPLAY_IMAGES):
            body = copy.deepcopy(turn2["body"])
            body["max_tokens"] = REPLAY_MAX_TOKENS
            png = sample.png_bytes()
            tool_result = next(
                block
                for message in body["messages"]
                if isinstance(message["content"], list)
                for block in message["content"]
                if block["type"] == "tool_result"
            )
            tool_result["content"][0]["source"]["data"] = base64.b64encode(png).decode()
            before = len(engine_recorder.recording.calls)
            _replay(http, body, _recorded_headers(turn2))
            (call,) = engine_recorder.recording.calls[before:]
            assert call.result is not None and call.result.usage.image_count == 1
            # Sent as the client put it (the image inside the tool result); the engine's lowering
            # gives the model the image in a following user turn.
            raw_tool = next(message for message in call.request.messages if message.role == pb.ROLE_TOOL)
            images = [part.image.data for part in raw_tool.tool_output.parts.parts if part.HasField("image")]
            assert images == [png]
            lowered = lower_messages(call.request.messages)
            roles = [message.role for message in lowered]
            tool_turn = roles.index(pb.ROLE_TOOL)
            assert lowered[tool_turn].tool_output.text.endswith(IMAGE_FOLLOW_UP_MARKER)
            follow_up = lowered[tool_turn + 1]
            assert follow_up.role == pb.ROLE_USER and follow_up.parts[0].image.data == png
