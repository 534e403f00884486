"""Issue 11's acceptance on the real stack: structured outputs and enforced tool choice, driven by the
real clients (openai SDK, openai-agents, langchain-openai) against `vlmserve-facade` in front of
`vlmserve-engine`: the session pair on the default fixture model and, for the forced-tool
scenarios and `responses.parse`, a facade in front of the random-weight fixture too.

The fixture model knows nothing about these tasks: whatever it writes is valid only because the
engine's grammar masks its logits. So every assertion below is about shape, never content.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from typing import Any

import httpx
import jsonschema
import openai
import pytest
from pydantic import BaseModel

from tests._openresponses import EVENT_SCHEMAS, assert_valid
from tests.facade.helpers import stream_events

MAX_TOKENS = 96


class Weather(BaseModel):
    city: str
    days: int
    rain: bool


class Town(BaseModel):
    name: str
    population: int


class Trip(BaseModel):  # nested: pydantic writes it with "$defs" and "$ref"
    start: Town
    stops: list[Town]


WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["c", "f"]}},
        "required": ["city", "unit"],
        "additionalProperties": False,
    },
    "strict": True,
}
TIME_TOOL = {
    "type": "function",
    "name": "get_time",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}},
}


@pytest.fixture(params=["default", "random"])
def any_facade_url(request: pytest.FixtureRequest) -> str:
    """Each test runs on the default fixture model and on the random-weight one."""
    name = "facade_url" if request.param == "default" else "random_facade_url"
    return str(request.getfixturevalue(name))


@pytest.fixture(scope="module")
def sdk(facade_url: str) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{facade_url}/v1", api_key="x", max_retries=0, timeout=120)
    yield client
    client.close()


# -- openai SDK ---------------------------------------------------------------------------------


@pytest.mark.parametrize("model", [Weather, Trip])
def test_responses_parse_returns_the_pydantic_model(any_facade_url: str, model: type[BaseModel]) -> None:
    with openai.OpenAI(base_url=f"{any_facade_url}/v1", api_key="x", max_retries=0, timeout=120) as client:
        response = client.responses.parse(
            model="default", input="Fill it in.", text_format=model, max_output_tokens=MAX_TOKENS
        )
    assert response.status == "completed"
    assert isinstance(response.output_parsed, model)


def test_responses_stream_with_text_format_ends_with_the_parsed_model(sdk: openai.OpenAI) -> None:
    with sdk.responses.stream(
        model="default", input="Fill it in.", text_format=Weather, max_output_tokens=MAX_TOKENS
    ) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert isinstance(final.output_parsed, Weather)
    assert "".join(deltas) == final.output_text


def test_json_object_format(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(
        model="default",
        input="Answer in JSON.",
        text={"format": {"type": "json_object"}},
        max_output_tokens=MAX_TOKENS,
    )
    assert isinstance(json.loads(response.output_text), dict)
    assert response.text.format.type == "json_object"


UNENFORCEABLE = {"type": "object", "properties": {"id": {"type": "string", "pattern": "^(?!x)"}}}


def test_a_strict_schema_that_cannot_be_enforced_is_a_400_naming_text_format_schema(
    sdk: openai.OpenAI,
) -> None:
    with pytest.raises(openai.BadRequestError) as caught:
        sdk.responses.create(
            model="default",
            input="x",
            text={"format": {"type": "json_schema", "name": "ids", "schema": UNENFORCEABLE, "strict": True}},
        )
    error = caught.value.body
    assert isinstance(error, dict)
    assert error["param"] == "text.format.schema"
    assert "look-around" in error["message"]


def test_a_non_strict_schema_that_cannot_be_enforced_still_gives_json(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(
        model="default",
        input="x",
        text={"format": {"type": "json_schema", "name": "ids", "schema": UNENFORCEABLE, "strict": False}},
        max_output_tokens=MAX_TOKENS,
    )
    json.loads(response.output_text)


# -- forced tool choice (the Open Responses scenarios that failed on the random fixture) ------------


def _forced_named_tool_body(stream: bool) -> dict[str, Any]:
    return {
        "model": "default",
        "input": "What is the weather in Paris?",
        "tools": [WEATHER_TOOL, TIME_TOOL],
        "tool_choice": {"type": "function", "name": "get_weather"},
        "max_output_tokens": MAX_TOKENS,
        "stream": stream,
    }


def _assert_one_weather_call(response: dict[str, Any]) -> None:
    assert response["status"] == "completed"
    calls = [item for item in response["output"] if item["type"] == "function_call"]
    assert [call["name"] for call in calls] == ["get_weather"]
    jsonschema.validate(json.loads(calls[0]["arguments"]), WEATHER_TOOL["parameters"])
    assert not any(item["type"] == "message" for item in response["output"])


def test_forced_named_tool(any_facade_url: str) -> None:
    reply = httpx.post(f"{any_facade_url}/v1/responses", json=_forced_named_tool_body(False), timeout=120)
    assert reply.status_code == 200, reply.text
    assert_valid(reply.json(), "ResponseResource")
    _assert_one_weather_call(reply.json())


def test_forced_named_tool_streamed(any_facade_url: str) -> None:
    reply = httpx.post(f"{any_facade_url}/v1/responses", json=_forced_named_tool_body(True), timeout=120)
    assert reply.status_code == 200, reply.text
    events = stream_events(reply.text)
    for event in events:
        assert_valid(event, EVENT_SCHEMAS[event["type"]])
    types = [event["type"] for event in events]
    assert "response.function_call_arguments.done" in types and "response.output_text.delta" not in types
    assert types[-1] == "response.completed"
    _assert_one_weather_call(events[-1]["response"])


@pytest.mark.parametrize(
    "tool_choice",
    [
        "required",
        {"type": "allowed_tools", "mode": "required", "tools": [{"type": "function", "name": "get_time"}]},
    ],
)
def test_required_tool_choice_gives_calls_to_allowed_tools(sdk: openai.OpenAI, tool_choice: Any) -> None:
    response = sdk.responses.create(
        model="default",
        input="Go.",
        tools=[WEATHER_TOOL, TIME_TOOL],  # type: ignore[list-item]
        tool_choice=tool_choice,
        max_output_tokens=MAX_TOKENS,
        max_tool_calls=2,
    )
    calls = [item for item in response.output if item.type == "function_call"]
    allowed = {"get_weather", "get_time"} if tool_choice == "required" else {"get_time"}
    assert 1 <= len(calls) <= 2 and {call.name for call in calls} <= allowed
    for call in calls:
        assert isinstance(json.loads(call.arguments), dict)


# -- openai-agents --------------------------------------------------------------------------------


def _agents_model(facade_url: str) -> Any:
    from agents import OpenAIResponsesModel, set_tracing_disabled

    set_tracing_disabled(True)
    client = openai.AsyncOpenAI(base_url=f"{facade_url}/v1", api_key="x", max_retries=0, timeout=120)
    return OpenAIResponsesModel(model="default", openai_client=client)


def test_agents_output_type(facade_url: str) -> None:
    from agents import Agent, ModelSettings, Runner

    agent = Agent(
        name="forecaster",
        instructions="Give the forecast.",
        model=_agents_model(facade_url),
        model_settings=ModelSettings(max_tokens=MAX_TOKENS),
        output_type=Weather,
    )
    result = asyncio.run(Runner.run(agent, "Oslo, three days.", max_turns=2))
    assert isinstance(result.final_output, Weather)


def test_agents_required_tool_choice_runs_the_function_tool(facade_url: str) -> None:
    from agents import Agent, ModelSettings, Runner, function_tool

    seen: list[str] = []

    @function_tool
    def lookup(city: str) -> str:
        """Look a city up."""
        seen.append(city)
        return f"{city}: sunny"

    agent = Agent(
        name="looker",
        instructions="Use the tool.",
        model=_agents_model(facade_url),
        model_settings=ModelSettings(tool_choice="required", max_tokens=MAX_TOKENS),
        tools=[lookup],
        # After the tool ran, stop with its output: the run must not depend on what a fixture
        # model writes on its own.
        tool_use_behavior="stop_on_first_tool",
    )
    result = asyncio.run(Runner.run(agent, "Look up Oslo.", max_turns=2))
    assert len(seen) == 1 and isinstance(seen[0], str)
    assert result.final_output == f"{seen[0]}: sunny"


# -- langchain-openai -----------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["json_schema", "function_calling"])
def test_langchain_with_structured_output(facade_url: str, method: str) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model="default",
        base_url=f"{facade_url}/v1",
        api_key="x",  # type: ignore[arg-type]
        use_responses_api=True,
        max_tokens=MAX_TOKENS,  # type: ignore[call-arg]
        max_retries=0,
    )
    result = chat.with_structured_output(Weather, method=method).invoke("Oslo, three days.")  # type: ignore[arg-type]
    assert isinstance(result, Weather)


def test_langchain_with_structured_output_json_mode(facade_url: str) -> None:
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model="default",
        base_url=f"{facade_url}/v1",
        api_key="x",  # type: ignore[arg-type]
        use_responses_api=True,
        max_tokens=MAX_TOKENS,  # type: ignore[call-arg]
        max_retries=0,
    )
    # json_mode promises a JSON object, not a schema (OpenAI's json_object): ask for a dict.
    schema = Weather.model_json_schema()
    result = chat.with_structured_output(schema, method="json_mode").invoke("Reply in JSON.")
    assert isinstance(result, dict)
