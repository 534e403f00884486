"""The pinned Vercel AI SDK's Anthropic provider (npm `ai` + `@ai-sdk/anthropic`, package.json)
against the real stack on the squares model: tests/vercel/ai_sdk_anthropic_client.mjs drives
POST /v1/messages. `generateText` runs a tool loop whose tool result is an image; `streamText`
streams the answer to a user image. The squares model answers "<N> <colour>" only when the
image reached it.

Skipped only where node or the npm packages are missing, and never under CI (CI=true).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests._services import REPO
from training.squares import AGENT_PROMPT, QUESTION, make_samples

SCRIPT = Path(__file__).with_name("ai_sdk_anthropic_client.mjs")
PINNED = {"ai": "6.0.325", "@ai-sdk/anthropic": "3.0.140"}
NODE_TIMEOUT_S = 180
SAMPLES = make_samples(20_261_205, 3)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def base_url(facade_url: str) -> str:
    reason = None
    if shutil.which("node") is None:
        reason = "node is not on PATH"
    for package in PINNED:
        if not (REPO / "node_modules" / package / "package.json").exists():
            reason = f"node_modules/{package} is missing: run `make node-deps`"
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the AI SDK must run in CI: {reason}")
        pytest.skip(reason)
    return f"{facade_url}/v1"


def run_client(base_url: str, case: str, png: Path, prompt: str) -> dict[str, Any]:
    command = ["node", str(SCRIPT), base_url, case, str(png), prompt]
    done = subprocess.run(command, capture_output=True, text=True, timeout=NODE_TIMEOUT_S, cwd=REPO)
    assert done.returncode == 0, f"{case} failed:\n{done.stderr[-6000:]}"
    assert "Warning" not in done.stderr, done.stderr[-6000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_pinned_versions(base_url: str) -> None:
    for package, version in PINNED.items():
        manifest = json.loads((REPO / "node_modules" / package / "package.json").read_text())
        assert manifest["version"] == version


@pytest.mark.parametrize("index", range(len(SAMPLES)))
def test_generate_text_with_an_image_tool_result(base_url: str, tmp_path: Path, index: int) -> None:
    sample = SAMPLES[index]
    png = tmp_path / "screen.png"
    png.write_bytes(sample.png_bytes())
    result = run_client(base_url, "image-tool", png, AGENT_PROMPT)
    assert result["taken"] == 1 and result["warnings"] == []
    first, second = result["steps"]
    assert (first["finishReason"], first["toolCalls"]) == ("tool-calls", ["screenshot"])
    assert second["finishReason"] == "stop"
    assert result["text"].strip() == sample.answer


def test_stream_text(base_url: str, tmp_path: Path) -> None:
    sample = SAMPLES[0]
    png = tmp_path / "screen.png"
    png.write_bytes(sample.png_bytes())
    result = run_client(base_url, "stream", png, QUESTION)
    assert len(result["deltas"]) > 1 and "".join(result["deltas"]) == result["text"]
    assert result["text"].strip() == sample.answer and result["finishReason"] == "stop"
    assert result["usage"]["inputTokens"] > 0 and result["usage"]["outputTokens"] > 0
