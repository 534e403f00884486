"""A thinking model's reasoning on the real stack (vlmserve-engine on the Qwen3-VL-Thinking
random fixture + vlmserve-facade), through the openai SDK: the `reasoning` item on
/v1/responses, `reasoning_content` on /v1/chat/completions (streamed and not), and a replayed
reasoning item reaching the prompt (counted in `input_tokens`).

The random model never closes `<think>` by itself, so its whole output is reasoning and the
answer is empty; a forced tool call closes it in time for the call to fit the token budget.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest
from transformers import AutoTokenizer

from tests._services import start_engine, start_facade

pytestmark = pytest.mark.needs_model

THOUGHT = "The user wants the weather in Oslo; call the tool."
TOOL: Any = {
    "type": "function",
    "name": "weather",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    "strict": True,
}


@pytest.fixture(scope="module")
def thinking_stack(
    family_models: dict[str, Path], service_logs: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[openai.OpenAI]:
    engine = start_engine(service_logs, model=str(family_models["qwen3_vl_thinking"]))
    store = tmp_path_factory.mktemp("thinking-store") / "responses.sqlite3"
    facade = start_facade(service_logs, engine.address, store_path=store)
    client = openai.OpenAI(base_url=f"{facade.address}/v1", api_key="x", max_retries=0, timeout=120)
    try:
        yield client
    finally:
        client.close()
        facade.stop()
        engine.stop()


def test_responses_return_a_reasoning_item(thinking_stack: openai.OpenAI) -> None:
    response = thinking_stack.responses.create(
        model="default", input="Think.", max_output_tokens=12, temperature=0
    )
    kinds = [item.type for item in response.output]
    assert kinds[0] == "reasoning"
    reasoning: Any = response.output[0]
    assert reasoning.content and reasoning.content[0].text
    assert "<think>" not in response.output_text and reasoning.content[0].text not in response.output_text
    assert response.usage is not None and response.usage.output_tokens_details.reasoning_tokens > 0


def test_chat_completions_reasoning_content_streamed_and_not(thinking_stack: openai.OpenAI) -> None:
    messages: Any = [{"role": "user", "content": "Think."}]
    completion = thinking_stack.chat.completions.create(
        model="default", messages=messages, max_tokens=12, temperature=0
    )
    message: Any = completion.choices[0].message
    assert message.reasoning_content
    assert message.reasoning_content not in (message.content or "")
    streamed = ""
    for chunk in thinking_stack.chat.completions.create(
        model="default", messages=messages, max_tokens=12, temperature=0, stream=True
    ):
        for choice in chunk.choices:
            streamed += getattr(choice.delta, "reasoning_content", None) or ""
    assert streamed == message.reasoning_content


def test_a_forced_call_follows_the_thinking(thinking_stack: openai.OpenAI) -> None:
    response = thinking_stack.responses.create(
        model="default",
        input="Weather in Oslo?",
        tools=[TOOL],
        tool_choice="required",
        max_output_tokens=60,
        temperature=0,
    )
    # The thinking (closed early so the call fits the budget) never leaks into the call.
    kinds = [item.type for item in response.output]
    assert kinds in (["function_call"], ["reasoning", "function_call"])
    call: Any = response.output[-1]
    assert call.name == "weather" and isinstance(json.loads(call.arguments)["city"], str)


def test_a_replayed_reasoning_item_reaches_the_prompt(
    thinking_stack: openai.OpenAI, family_models: dict[str, Path]
) -> None:
    def input_tokens(with_reasoning: bool) -> int:
        reasoning = {
            "type": "reasoning",
            "summary": [],
            "content": [{"type": "reasoning_text", "text": THOUGHT}],
        }
        items: Any = [
            {"role": "user", "content": "Weather in Oslo?"},
            *([reasoning] if with_reasoning else []),
            {
                "type": "function_call",
                "call_id": "call_1",
                "name": "weather",
                "arguments": '{"city": "Oslo"}',
            },
            {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
        ]
        response = thinking_stack.responses.create(
            model="default", input=items, tools=[TOOL], max_output_tokens=1, temperature=0
        )
        assert response.usage is not None
        return response.usage.input_tokens

    tokenizer = AutoTokenizer.from_pretrained(family_models["qwen3_vl_thinking"])
    block = len(tokenizer.encode(f"<think>\n{THOUGHT}\n</think>\n\n"))
    assert input_tokens(True) - input_tokens(False) == block
