"""`/v1/messages/count_tokens` applies `context_management.edits` as `/v1/messages` does (issue
36.2): what the engine is asked to count is what the model would be sent, and the answer says
the count before the edits (`context_management.original_input_tokens`), as Anthropic answers.
The real engine's counts: tests/e2e/test_context_real_stack.py."""

from __future__ import annotations

from typing import Any

import anthropic
import httpx

from tests.facade.fake_engine import FakeEngine
from tests.facade.test_anthropic_context_management import CLEAR, body, tool_outputs

THINKING = {"type": "clear_thinking_20251015", "keep": {"type": "thinking_turns", "value": 1}}


def counted(body: dict[str, Any]) -> dict[str, Any]:
    return {key: value for key, value in body.items() if key != "max_tokens"}


async def test_the_counted_prompt_has_the_results_cleared(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    reply = await http.post(
        "/v1/messages/count_tokens", json=counted(body(context_management={"edits": [CLEAR]}))
    )
    assert reply.status_code == 200, reply.text
    answer = reply.json()
    assert set(answer) == {"input_tokens", "context_management"}
    assert set(answer["context_management"]) == {"original_input_tokens"}
    # Counted as sent, then counted again with the results cleared: the answer is the second.
    original, edited = engine.count_requests
    assert tool_outputs(original) == [f"contents of file {n}" for n in range(3)]
    assert tool_outputs(edited) == ["[Tool result cleared to save context]"] * 2 + ["contents of file 2"]
    # /v1/messages sends the same prompt.
    await http.post("/v1/messages", json=body(context_management={"edits": [CLEAR]}))
    assert list(engine.requests[-1].messages) == list(edited.messages)


async def test_below_the_trigger_the_counts_are_equal(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    high = {**CLEAR, "trigger": {"type": "input_tokens", "value": 100_000}}
    reply = await http.post(
        "/v1/messages/count_tokens", json=counted(body(context_management={"edits": [high]}))
    )
    answer = reply.json()
    assert answer["input_tokens"] == answer["context_management"]["original_input_tokens"]
    assert len(engine.count_requests) == 1


async def test_cleared_thinking_is_not_counted(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    def turn(thinking: str, text: str) -> dict[str, Any]:
        blocks = [
            {"type": "thinking", "thinking": thinking, "signature": "s"},
            {"type": "text", "text": text},
        ]
        return {"role": "assistant", "content": blocks}

    messages = [
        {"role": "user", "content": "one"},
        turn("old", "a"),
        {"role": "user", "content": "two"},
        turn("new", "b"),
        {"role": "user", "content": "three"},
    ]
    request = {"model": "default", "messages": messages, "context_management": {"edits": [THINKING]}}
    reply = await http.post("/v1/messages/count_tokens", json=request)
    assert reply.status_code == 200, reply.text
    original, edited = engine.count_requests
    assert [m.reasoning_text for m in original.messages if m.reasoning_text] == ["old", "new"]
    assert [m.reasoning_text for m in edited.messages if m.reasoning_text] == ["new"]


async def test_a_replayed_compaction_block_is_counted_as_its_summary(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    messages = [
        {"role": "user", "content": "A long task with many words in it."},
        {"role": "assistant", "content": [{"type": "compaction", "content": "Goal: read files."}]},
        {"role": "user", "content": "Continue."},
    ]
    reply = await http.post("/v1/messages/count_tokens", json={"model": "default", "messages": messages})
    assert reply.status_code == 200, reply.text
    # No edits asked for: the plain answer, of the prompt from the block on.
    assert set(reply.json()) == {"input_tokens"}
    (sent,) = engine.count_requests
    assert [p.text.text for m in sent.messages for p in m.parts] == [
        "Summary of the conversation so far:\nGoal: read files.",
        "Continue.",
    ]


async def test_the_anthropic_sdk_reads_it(server_url: str, engine: FakeEngine) -> None:
    sdk = anthropic.AsyncAnthropic(base_url=server_url, api_key="x", max_retries=0, timeout=10)
    request = counted(body())
    result = await sdk.beta.messages.count_tokens(
        model=request["model"],
        messages=request["messages"],
        tools=request["tools"],
        context_management={"edits": [CLEAR]},  # type: ignore[arg-type]
        betas=["context-management-2025-06-27"],
    )
    assert result.context_management is not None
    assert result.context_management.original_input_tokens >= result.input_tokens
    await sdk.close()


async def test_a_bad_edit_is_a_400_naming_it(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    request = counted(body(context_management={"edits": [{"type": "clear_all"}]}))
    reply = await http.post("/v1/messages/count_tokens", json=request)
    assert reply.status_code == 400
    assert reply.json()["error"]["type"] == "invalid_request_error"
    assert "context_management.edits[0].type" in reply.json()["error"]["message"]
    assert engine.count_requests == []
