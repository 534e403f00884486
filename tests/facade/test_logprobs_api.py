"""Token logprobs through the facade (scripted engine): Responses `top_logprobs` + include, and
chat completions `logprobs` / `top_logprobs`, streamed and not, parsed with the openai SDK's
types and checked against the vendored Open Responses schema."""

from __future__ import annotations

import json
from typing import Any

import httpx
import openai
import pytest
from openai.types.responses import ResponseTextDeltaEvent

from tests._sse import aiter_lines
from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import EVENT_SCHEMAS, assert_valid
from vlmserve.engine.v1 import engine_pb2 as pb

INCLUDE: Any = ["message.output_text.logprobs"]


def token(text: str, logprob: float, *alternatives: tuple[str, float]) -> pb.TokenLogprob:
    return pb.TokenLogprob(
        token=text,
        logprob=logprob,
        top_logprobs=[pb.TopLogprob(token=t, logprob=lp) for t, lp in alternatives],
    )


# "Hello", ", ", "world." as the scripted engine streams them, one token each but the last (two).
TOKENS = [
    [token("Hello", -0.5, ("Hello", -0.5), ("Hi", -1.25))],
    [token(", ", -0.25, (", ", -0.25), ("!", -2.0))],
    [token("wor", -1.0, ("wor", -1.0), ("ear", -1.5)), token("ld.", -0.125, ("ld.", -0.125), ("ld", -3.0))],
]


@pytest.fixture
def scripted(engine: FakeEngine) -> FakeEngine:
    engine.script.text_logprobs = TOKENS
    return engine


def expected(top: int | None) -> list[tuple[str, float, list[str]]]:
    return [
        (
            entry.token,
            entry.logprob,
            [alt.token for alt in entry.top_logprobs][: top if top is not None else 99],
        )
        for chunk in TOKENS
        for entry in chunk
    ]


async def test_responses_top_logprobs_and_include(sdk: openai.AsyncOpenAI, scripted: FakeEngine) -> None:
    response = await sdk.responses.create(model="default", input="Hi", top_logprobs=2, include=INCLUDE)
    assert response.top_logprobs == 2
    sampling = scripted.requests[0].sampling
    assert (sampling.logprobs, sampling.top_logprobs) == (True, 2)
    (part,) = response.output[0].content  # type: ignore[union-attr]
    assert part.type == "output_text" and part.logprobs is not None
    assert [(lp.token, lp.logprob, [t.token for t in lp.top_logprobs]) for lp in part.logprobs] == expected(
        None
    )
    assert part.logprobs[0].bytes == list(b"Hello")
    assert "".join(lp.token for lp in part.logprobs) == part.text == response.output_text


async def test_responses_raw_json_validates_against_the_open_responses_schema(
    server_url: str, scripted: FakeEngine
) -> None:
    async with httpx.AsyncClient(base_url=server_url, timeout=10) as http:
        body = {"model": "default", "input": "Hi", "top_logprobs": 2, "include": INCLUDE}
        plain = (await http.post("/v1/responses", json=body)).json()
        assert_valid(plain, "ResponseResource")
        assert len(plain["output"][0]["content"][0]["logprobs"]) == 4
        async with http.stream("POST", "/v1/responses", json={**body, "stream": True}) as stream:
            lines = [line async for line in aiter_lines(stream) if line.startswith("data: {")]
    events = [json.loads(line.removeprefix("data: ")) for line in lines]
    for event in events:
        if event["type"] in EVENT_SCHEMAS:
            assert_valid(event, EVENT_SCHEMAS[event["type"]])
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert [len(e["logprobs"]) for e in deltas] == [1, 1, 2]
    (done,) = [e for e in events if e["type"] == "response.output_text.done"]
    assert done["logprobs"] == [entry for e in deltas for entry in e["logprobs"]]


async def test_responses_streamed_deltas_carry_logprobs(
    sdk: openai.AsyncOpenAI, scripted: FakeEngine
) -> None:
    deltas: list[ResponseTextDeltaEvent] = []
    async with sdk.responses.stream(model="default", input="Hi", include=INCLUDE) as stream:
        async for event in stream:
            if isinstance(event, ResponseTextDeltaEvent):
                deltas.append(event)
        final = await stream.get_final_response()
    streamed = [(lp.token, lp.logprob) for event in deltas for lp in event.logprobs]
    assert streamed == [(token, logprob) for token, logprob, _ in expected(None)]
    (part,) = final.output[0].content  # type: ignore[union-attr]
    assert [(lp.token, lp.logprob) for lp in part.logprobs or []] == streamed
    assert scripted.requests[0].sampling.top_logprobs == 0


async def test_no_logprobs_unless_asked(sdk: openai.AsyncOpenAI, scripted: FakeEngine) -> None:
    response = await sdk.responses.create(model="default", input="Hi")
    assert not scripted.requests[0].sampling.logprobs
    assert response.output[0].content[0].logprobs == []  # type: ignore[union-attr]
    completion = await sdk.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi"}]
    )
    assert completion.choices[0].logprobs is None


async def test_chat_logprobs(sdk: openai.AsyncOpenAI, scripted: FakeEngine) -> None:
    completion = await sdk.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi"}], logprobs=True, top_logprobs=2
    )
    sampling = scripted.requests[0].sampling
    assert (sampling.logprobs, sampling.top_logprobs) == (True, 2)
    logprobs = completion.choices[0].logprobs
    assert logprobs is not None and logprobs.content is not None
    got = [(lp.token, lp.logprob, [t.token for t in lp.top_logprobs]) for lp in logprobs.content]
    assert got == expected(None)
    assert "".join(lp.token for lp in logprobs.content) == completion.choices[0].message.content


async def test_chat_logprobs_streamed(sdk: openai.AsyncOpenAI, scripted: FakeEngine) -> None:
    stream = await sdk.chat.completions.create(
        model="default", messages=[{"role": "user", "content": "Hi"}], logprobs=True, stream=True
    )
    content, tokens = "", []
    async for chunk in stream:
        for choice in chunk.choices:
            content += choice.delta.content or ""
            if choice.logprobs is not None and choice.logprobs.content:
                tokens += [lp.token for lp in choice.logprobs.content]
    assert content == "Hello, world." == "".join(tokens)
    assert scripted.requests[0].sampling.logprobs


async def test_langchain_chat_openai_logprobs(server_url: str, scripted: FakeEngine) -> None:
    # LangChain's default (chat completions) mode; with use_responses_api it passes `logprobs`
    # to the SDK's responses.create, which has no such argument (a client-side TypeError).
    from langchain_openai import ChatOpenAI

    chat = ChatOpenAI(
        model="default",
        base_url=f"{server_url}/v1",
        api_key="x",  # type: ignore[arg-type]
        max_retries=0,
        logprobs=True,
        top_logprobs=2,
    )
    message = await chat.ainvoke("Hi")
    sampling = scripted.requests[0].sampling
    assert (sampling.logprobs, sampling.top_logprobs) == (True, 2)
    content = message.response_metadata["logprobs"]["content"]
    assert "".join(entry["token"] for entry in content) == message.content == "Hello, world."
    assert [len(entry["top_logprobs"]) for entry in content] == [2, 2, 2, 2]


async def test_logprobs_are_sent_at_float32_precision(server_url: str, engine: FakeEngine) -> None:
    # The contract's logprob is a float32: -0.1 arrives as -0.10000000149011612, which took 19
    # bytes per number (21 numbers a token with top_logprobs 20), for digits it never held.
    engine.script.text_logprobs = [[token("Hi", -0.1, ("Hi", -0.1), ("Yo", -2.3456789))]]
    engine.script.text_chunks = ["Hi"]
    body = {"model": "default", "input": "Hi", "top_logprobs": 2, "include": INCLUDE, "stream": True}
    async with (
        httpx.AsyncClient(base_url=server_url, timeout=10) as http,
        http.stream("POST", "/v1/responses", json=body) as stream,
    ):
        text = "\n".join([line async for line in aiter_lines(stream)])
    assert '"logprob":-0.1,' in text and '"logprob":-2.345679,' in text
    assert "0000000" not in text and "99999" not in text
