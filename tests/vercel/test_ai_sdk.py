"""The pinned Vercel AI SDK (npm `ai` + `@ai-sdk/openai`, package.json) against the real stack: the
node script tests/vercel/ai_sdk_client.mjs drives the facade in front of the random-weight fixture,
through both of the SDK's OpenAI providers — `openai.responses(...)` (POST /v1/responses) and
`openai.chat(...)` (POST /v1/chat/completions).

The fixture model knows nothing: its tool calls and JSON objects are well formed only because the
engine's grammar enforces them, and its free text runs to the token cap. So every assertion below is
about what the SDK sent, received and did, never about content.

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

from tests._pdfs import text_pdf
from tests._services import REPO
from tests.facade.helpers import png_bytes

SCRIPT = Path(__file__).with_name("ai_sdk_client.mjs")
PINNED = {"ai": "6.0.325", "@ai-sdk/openai": "3.0.141"}
PROVIDERS = ["responses", "chat"]
NODE_TIMEOUT_S = 180

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]


def _unavailable_reason() -> str | None:
    if shutil.which("node") is None:
        return "node is not on PATH (`.ci/run` installs it; locally: apt-get install nodejs npm)"
    for package in PINNED:
        if not (REPO / "node_modules" / package / "package.json").exists():
            return f"node_modules/{package} is missing: run `make node-deps`"
    return None


@pytest.fixture(scope="module")
def base_url(random_facade_url: str) -> str:
    reason = _unavailable_reason()
    if reason is not None:
        if os.environ.get("CI"):
            pytest.fail(f"the AI SDK must run in CI: {reason}")
        pytest.skip(reason)
    return f"{random_facade_url}/v1"


def run_client(base_url: str, provider: str, case: str, file: Path | None = None) -> dict[str, Any]:
    """One case of the node script; its JSON result, or the test fails with the SDK's error."""
    command = ["node", str(SCRIPT), base_url, provider, case, *([str(file)] if file else [])]
    done = subprocess.run(command, capture_output=True, text=True, timeout=NODE_TIMEOUT_S, cwd=REPO)
    assert done.returncode == 0, f"{case} via {provider} failed:\n{done.stderr[-6000:]}"
    # The SDK warns (stderr) about settings or results a provider did not honour: none expected.
    assert "Warning" not in done.stderr, done.stderr[-6000:]
    result: dict[str, Any] = json.loads(done.stdout)
    return result


def test_pinned_versions(base_url: str) -> None:
    for package, version in PINNED.items():
        manifest = json.loads((REPO / "node_modules" / package / "package.json").read_text())
        assert manifest["version"] == version


@pytest.mark.parametrize("provider", PROVIDERS)
def test_generate_text_with_an_image_and_a_tool_loop(base_url: str, provider: str, tmp_path: Path) -> None:
    image = tmp_path / "postcard.png"
    image.write_bytes(png_bytes((0, 0, 255), (32, 32)))
    result = run_client(base_url, provider, "image-tool", image)
    first, second = result["steps"]
    # Step 1: the required call of `lookup`, with arguments the SDK validated against its zod schema,
    # and the tool ran on them.
    assert first["finishReason"] == "tool-calls"
    (call,) = first["toolCalls"]
    assert call["name"] == "lookup" and isinstance(call["input"]["city"], str)
    assert result["looked"] == [call["input"]["city"]]
    # Step 2: the call and its result went back with the image, and the model answered in text.
    body = second["requestBody"]
    if provider == "responses":
        items = body["input"]
        assert [item.get("type") for item in items[1:]] == ["function_call", "function_call_output"]
        assert items[0]["content"][1]["type"] == "input_image"
        assert items[2]["output"] == first["toolResults"][0]["output"]
    else:
        messages = body["messages"]
        assert [message["role"] for message in messages] == ["user", "assistant", "tool"]
        assert messages[0]["content"][1]["type"] == "image_url"
        assert messages[2]["content"] == first["toolResults"][0]["output"]
    assert second["finishReason"] == "length" and second["toolCalls"] == []
    assert result["text"] == second["text"] and result["text"]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_stream_text(base_url: str, provider: str) -> None:
    result = run_client(base_url, provider, "stream")
    assert result["parts"][:3] == ["start", "start-step", "text-start"]
    assert result["parts"][-3:] == ["text-end", "finish-step", "finish"]
    assert "".join(result["deltas"]) == result["text"] and result["text"]
    assert result["finishReason"] == "length"
    assert result["usage"]["outputTokens"] == 12 and result["usage"]["inputTokens"] > 0


@pytest.mark.parametrize("provider", PROVIDERS)
def test_stream_text_with_a_tool_loop(base_url: str, provider: str) -> None:
    result = run_client(base_url, provider, "stream-tool")
    first, second = result["steps"]
    assert first["finishReason"] == "tool-calls"
    (call,) = first["toolCalls"]
    assert call["name"] == "lookup" and isinstance(call["input"]["city"], str)
    assert first["toolResults"] == [{"name": "lookup", "output": f"{call['input']['city']}: population 1000"}]
    parts = result["parts"]
    assert parts.index("tool-input-start") < parts.index("tool-input-delta") < parts.index("tool-call")
    assert parts.index("tool-call") < parts.index("tool-result") < parts.index("text-delta")
    assert "text-start" not in parts[: parts.index("finish-step")], "no empty text part before the call"
    assert second["finishReason"] == "length" and second["text"] and parts[-1] == "finish"


@pytest.mark.parametrize("provider", PROVIDERS)
def test_objects_with_a_zod_schema(base_url: str, provider: str) -> None:
    result = run_client(base_url, provider, "object")
    # The SDK parsed and validated each object against its zod schema before returning it.
    for answer in (result["object"], result["output"], result["streamedObject"]):
        assert set(answer) == {"city", "days", "rain"}
    assert result["finishReason"] == "stop"
    assert result["partials"] > 1  # streamObject saw the object grow


@pytest.mark.parametrize("provider", PROVIDERS)
def test_a_pdf_file_part(base_url: str, provider: str, tmp_path: Path) -> None:
    pdf = tmp_path / "report.pdf"
    pdf.write_bytes(text_pdf(["Page one: apples", "Page two: pears"]))
    result = run_client(base_url, provider, "pdf", pdf)
    # The SDK sent the PDF inline: `input_file` on /v1/responses, a `file` part on chat.
    sent = result["sent"]["input" if provider == "responses" else "messages"]
    part = sent[0]["content"][1]
    if provider == "responses":
        assert part["type"] == "input_file" and part["filename"] == "report.pdf"
        assert part["file_data"].startswith("data:application/pdf;base64,")
    else:
        assert part["type"] == "file" and part["file"]["filename"] == "report.pdf"
        assert part["file"]["file_data"].startswith("data:application/pdf;base64,")
    assert result["finishReason"] == "length" and result["text"]
    # Each page's text and image reached the model.
    assert result["usage"]["inputTokens"] > result["aloneUsage"]["inputTokens"]
