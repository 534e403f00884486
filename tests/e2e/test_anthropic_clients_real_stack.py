"""Anthropic-API clients (pinned in pyproject's dev extra) on the real stack: LangChain's
`ChatAnthropic` (invoke, stream, tools, with_structured_output) and the Claude Agent SDK (a
query whose custom tool returns an image), against `vlmserve-facade` + `vlmserve-engine` on the
squares model.

The squares model answers "<N> <colour>" from an image (and "no image" without one), so the
image answers are checked for content; tool calls and JSON are well formed because the engine's
grammar enforces them, so those assertions are about the protocol.
"""

from __future__ import annotations

import asyncio
import base64
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path
from typing import Any, Literal

import pytest

from tests._engine_recorder import EngineRecorder
from tests._services import ServiceProcess
from tests.claude_code.record_claude_requests import make_handler
from tests.claude_code.test_claude_code import claude_env
from training.squares import AGENT_PROMPT, PALETTE, QUESTION, make_samples
from vlmserve.engine.prep.lowering import lower_messages

pytestmark = pytest.mark.slow

MAX_TOKENS = 32
SAMPLES = make_samples(20_261_204, 4)


def image_block(png: bytes) -> dict[str, Any]:
    return {
        "type": "image",
        "source": {"type": "base64", "media_type": "image/png", "data": base64.b64encode(png).decode()},
    }


@pytest.fixture
def chat(facade_url: str) -> Any:
    from langchain_anthropic import ChatAnthropic

    return ChatAnthropic(  # type: ignore[call-arg]
        model="default", base_url=facade_url, api_key="x", max_tokens=MAX_TOKENS, max_retries=0, timeout=120
    )


def test_langchain_invoke_and_stream_see_the_image(chat: Any) -> None:
    from langchain_core.messages import HumanMessage

    for sample in SAMPLES:
        message = HumanMessage(content=[{"type": "text", "text": QUESTION}, image_block(sample.png_bytes())])
        assert chat.invoke([message]).text.strip() == sample.answer
        chunks = list(chat.stream([message]))
        assert len(chunks) > 1
        assert "".join(chunk.text for chunk in chunks).strip() == sample.answer
    assert chat.invoke("Hello").text.strip() == "no image"


def test_langchain_tool_loop_with_an_image_tool_result(chat: Any) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool

    sample = SAMPLES[0]

    @tool
    def screenshot() -> str:
        """Take a screenshot."""
        return "taken"

    messages: list[Any] = [HumanMessage(AGENT_PROMPT)]
    asked = chat.bind_tools([screenshot], tool_choice="any").invoke(messages)
    assert isinstance(asked, AIMessage)
    (call,) = asked.tool_calls
    assert call["name"] == "screenshot"
    result = ToolMessage(content=[image_block(sample.png_bytes())], tool_call_id=call["id"])
    final = chat.bind_tools([screenshot]).invoke([*messages, asked, result])
    assert final.tool_calls == [] and final.text.strip() == sample.answer


@pytest.mark.parametrize("method", ["function_calling", "json_schema"])
def test_langchain_with_structured_output(chat: Any, method: str) -> None:
    """A forced tool call (function_calling) or output_config.format (json_schema): the grammar
    makes the answer parse into the model. The squares model was never taught JSON: its digits
    are no count, so only the shape is checked."""
    from langchain_core.messages import HumanMessage
    from pydantic import BaseModel

    class Squares(BaseModel):
        count: int
        colour: Literal["red", "green", "blue", "yellow", "purple", "orange"]

    # Room for the digits the untaught model writes before the grammar lets it close.
    structured = chat.model_copy(update={"max_tokens": 64}).with_structured_output(Squares, method=method)
    sample = SAMPLES[1]
    content = [{"type": "text", "text": QUESTION}, image_block(sample.png_bytes())]
    answer = structured.invoke([HumanMessage(content=content)])
    assert isinstance(answer, Squares) and answer.colour in PALETTE


def test_claude_agent_sdk_custom_tool_returning_an_image(
    recorded_facade: ServiceProcess, engine_recorder: EngineRecorder, tmp_path: Path
) -> None:
    """A `query` whose in-process MCP tool returns a PNG. The model's decision to call the tool is
    scripted by a proxy in front of the facade (the squares model was never taught Claude Code's
    prompt); the Agent SDK's run of the tool and its tool_result reach the real facade and engine."""
    from claude_agent_sdk import ClaudeAgentOptions, ResultMessage, create_sdk_mcp_server, query, tool

    png = SAMPLES[2].png_bytes()
    calls: list[dict[str, Any]] = []

    @tool("screenshot", "Take a screenshot.", {})
    async def screenshot(args: dict[str, Any]) -> dict[str, Any]:
        calls.append(args)
        return {
            "content": [{"type": "image", "data": base64.b64encode(png).decode(), "mimeType": "image/png"}]
        }

    server = create_sdk_mcp_server("squares", tools=[screenshot])
    (tmp_path / "home").mkdir()
    handler = make_handler(recorded_facade.address, tmp_path, ("mcp__squares__screenshot", {}))
    proxy = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=proxy.serve_forever, daemon=True)
    thread.start()
    before = len(engine_recorder.recording.calls)
    try:
        env = claude_env(tmp_path / "home", f"http://127.0.0.1:{proxy.server_address[1]}")
        options = ClaudeAgentOptions(
            model="default",
            tools=[],
            mcp_servers={"squares": server},
            allowed_tools=["mcp__squares__screenshot"],
            max_turns=3,
            cwd=str(tmp_path),
            env=env,
        )

        async def run() -> list[Any]:
            return [message async for message in query(prompt="Take a screenshot.", options=options)]

        messages = asyncio.run(asyncio.wait_for(run(), 300))
    finally:
        proxy.shutdown()
        proxy.server_close()
    assert calls == [{}]
    (result,) = [message for message in messages if isinstance(message, ResultMessage)]
    assert not result.is_error, result
    seen = [call for call in engine_recorder.recording.calls[before:] if call.result is not None]
    # The engine receives the tool result as sent (the image inside it) and lowers it into a
    # following user turn where it renders the template: look where the model sees it.
    assert any(
        part.image.data == png
        for call in seen
        for message in lower_messages(call.request.messages)
        for part in message.parts
    ), "the tool's image never reached the engine"
    assert any(call.result.usage.image_count == 1 for call in seen if call.result is not None)
