"""openai-agents (pinned in pyproject's dev extra) on the real stack: parallel function tools (through
`OpenAIResponsesModel` and `OpenAIChatCompletionsModel`), a conversation session kept by the facade
(`OpenAIConversationsSession`, `pop_item` included) and a streamed run, against `vlmserve-facade` in
front of the random-weight fixture.

The fixture model knows nothing: its calls and JSON answers are well formed only because the engine's
grammar enforces them (tool_choice="required", `output_type`), so the assertions are about what the
SDK sent, stored and ran, never about content.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from pydantic import BaseModel

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]

MAX_TOKENS = 96


class Reply(BaseModel):
    ok: bool


@pytest.fixture(scope="module")
def loop() -> Iterator[asyncio.AbstractEventLoop]:
    """One loop for the module: the AsyncOpenAI client's connections belong to it."""
    loop = asyncio.new_event_loop()
    yield loop
    loop.close()


@pytest.fixture(scope="module")
def client(random_facade_url: str, loop: asyncio.AbstractEventLoop) -> Iterator[openai.AsyncOpenAI]:
    from agents import set_tracing_disabled

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{random_facade_url}/v1", api_key="x", max_retries=0, timeout=120)
    yield client
    loop.run_until_complete(client.close())


def _model(client: openai.AsyncOpenAI, api: str = "responses") -> Any:
    from agents import OpenAIChatCompletionsModel, OpenAIResponsesModel

    if api == "chat":
        return OpenAIChatCompletionsModel(model="default", openai_client=client)
    return OpenAIResponsesModel(model="default", openai_client=client)


@pytest.mark.parametrize("api", ["responses", "chat"])
def test_parallel_function_tools_all_run(
    client: openai.AsyncOpenAI, loop: asyncio.AbstractEventLoop, api: str
) -> None:
    from agents import Agent, ModelSettings, Runner, ToolCallItem, ToolCallOutputItem, function_tool

    ran: list[str] = []

    @function_tool
    def get_weather() -> str:
        """Today's weather."""
        ran.append("get_weather")
        return "sunny"

    @function_tool
    def get_time() -> str:
        """The time now."""
        ran.append("get_time")
        return "noon"

    agent = Agent(
        name="helper",
        instructions="Use the tools.",
        model=_model(client, api),
        # Greedy, so the fixture model's choice is the same every run: with parameterless tools it
        # fills the budget with calls, several in one turn.
        model_settings=ModelSettings(
            tool_choice="required", parallel_tool_calls=True, temperature=0, max_tokens=MAX_TOKENS
        ),
        tools=[get_weather, get_time],
        # Stop with the first tool's output once the turn's calls all ran: the run must not depend on
        # what the fixture model writes next.
        tool_use_behavior="stop_on_first_tool",
    )
    result = loop.run_until_complete(Runner.run(agent, "Weather and time, please.", max_turns=2))
    calls = [item for item in result.new_items if isinstance(item, ToolCallItem)]
    outputs = [item for item in result.new_items if isinstance(item, ToolCallOutputItem)]
    assert len(calls) >= 2, "one turn with several calls"
    assert len(outputs) == len(calls) == len(ran)
    assert {call.raw_item.call_id for call in calls} == {o.raw_item["call_id"] for o in outputs}  # type: ignore[union-attr,index]
    assert result.final_output == {"get_weather": "sunny", "get_time": "noon"}[ran[0]]
    if api == "chat":
        return  # chat completions are not stored
    (response,) = result.raw_responses
    assert response.response_id is not None
    stored = loop.run_until_complete(client.responses.retrieve(response.response_id))
    assert stored.parallel_tool_calls is True and stored.tool_choice == "required"


def _chat_agent(client: openai.AsyncOpenAI) -> Any:
    from agents import Agent, ModelSettings

    # `output_type` makes the fixture model's answer a complete JSON object that ends the turn.
    return Agent(
        name="chat",
        instructions="Chat.",
        model=_model(client),
        output_type=Reply,
        model_settings=ModelSettings(max_tokens=MAX_TOKENS),
    )


async def _input_texts(client: openai.AsyncOpenAI, response_id: str | None) -> list[str]:
    """The text of each message the model was given for `response_id`, in order."""
    assert response_id is not None
    items = await client.responses.input_items.list(response_id, order="asc")
    return [part.text for item in items.data if item.type == "message" for part in item.content]  # type: ignore[union-attr]


def test_conversations_session_with_pop_item_and_a_streamed_run(
    client: openai.AsyncOpenAI, loop: asyncio.AbstractEventLoop, caplog: pytest.LogCaptureFixture
) -> None:
    from agents import OpenAIConversationsSession, Runner

    agent = _chat_agent(client)
    session = OpenAIConversationsSession(openai_client=client)

    async def scenario() -> None:
        first = await Runner.run(agent, "Hello there.", session=session)
        second = await Runner.run(agent, "And again.", session=session)
        assert isinstance(first.final_output, Reply) and isinstance(second.final_output, Reply)
        items: list[Any] = list(await session.get_items())
        assert [(item["type"], item["role"]) for item in items] == [
            ("message", "user"),
            ("message", "assistant"),
            ("message", "user"),
            ("message", "assistant"),
        ]
        texts = [item["content"][0]["text"] for item in items]
        assert [item["content"][0]["type"] for item in items] == ["input_text", "output_text"] * 2
        # The second turn saw the first one, read back from the facade's conversation.
        assert await _input_texts(client, second.raw_responses[0].response_id) == texts[:3]
        # pop_item: the last item comes back and is gone from the conversation.
        popped: Any = await session.pop_item()
        assert popped == items[3]
        assert [item["id"] for item in await session.get_items()] == [item["id"] for item in items[:3]]

        # A streamed run on the same session, its events consumed to the end; it sees the history
        # without the popped answer.
        streamed = Runner.run_streamed(agent, "Stream it.", session=session)
        kinds = [
            (event.type, getattr(event, "name", None) or getattr(getattr(event, "data", None), "type", None))
            async for event in streamed.stream_events()
        ]
        assert streamed.is_complete and isinstance(streamed.final_output, Reply)
        assert ("raw_response_event", "response.output_text.delta") in kinds
        assert kinds[-2:] == [
            ("raw_response_event", "response.completed"),
            ("run_item_stream_event", "message_output_created"),
        ]
        (response,) = streamed.raw_responses
        assert await _input_texts(client, response.response_id) == [*texts[:3], "Stream it."]
        assert len(await session.get_items()) == 5
        # clear_session deletes the conversation on the facade.
        conversation_id = session.session_id
        await session.clear_session()
        with pytest.raises(openai.NotFoundError):
            await client.conversations.retrieve(conversation_id)

    with caplog.at_level(logging.WARNING):
        loop.run_until_complete(scenario())
    # The SDK validates what it reads back (conversation items, events): nothing to warn about.
    assert [r.getMessage() for r in caplog.records if r.name.startswith("openai")] == []
