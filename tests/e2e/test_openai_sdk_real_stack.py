"""Issue 3's acceptance on the real stack: the official `openai` SDK against `vlmserve-facade` in
front of `vlmserve-engine` on the fixture models.

Three stacks, all real processes:
- the session pair (`facade_url`, on the default fixture model `qwen2-vl-tiny`);
- a facade in front of a recording gRPC hop to the session engine, so that "the engine received
  one image" is the engine's own `usage.image_count` and the lowered request it was sent;
- the squares pair (`squares_facade_url`) for the streams that must end `response.completed`:
  the random-weight tiny model never writes its end-of-turn token (of 420 short prompts tried,
  none ended within 16 tokens), so with a small `max_output_tokens` it always ends `incomplete`, and
  the SDK's `get_final_response()` wants `response.completed`. The trained squares model answers
  and stops.
"""

from __future__ import annotations

import random
import re
import time
from collections.abc import Iterator
from typing import Any, cast

import httpx
import openai
import pytest
from openai.types.responses import Response, ResponseCompletedEvent

from tests._engine_recorder import EngineRecorder, RecordedCall
from tests._services import ServiceProcess
from tests.e2e import squares_requests as squares
from tests.facade.helpers import SCREENSHOT_TOOL, assert_valid, png_bytes, png_data_url, screenshot_tool_input
from training.squares import QUESTION, draw_sample
from vlmserve.engine.prep.lowering import IMAGE_FOLLOW_UP_MARKER, lower_messages
from vlmserve.engine.v1 import engine_pb2 as pb

MAX_TOKENS = 8
# Enough for the squares model's "<N> <colour>" and its end-of-turn token.
SQUARES_MAX_TOKENS = 16
RED = (255, 0, 0)
BLUE = (0, 0, 255)
TOOLS: list[Any] = [SCREENSHOT_TOOL]


def sdk_client(base_url: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key="x", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def sdk(facade_url: str) -> Iterator[openai.OpenAI]:
    client = sdk_client(facade_url)
    yield client
    client.close()


@pytest.fixture(scope="module")
def recorded_sdk(recorded_facade: ServiceProcess) -> Iterator[openai.OpenAI]:
    client = sdk_client(recorded_facade.address)
    yield client
    client.close()


def screenshot_input(image_url: str) -> Any:
    # The SDK's TypedDicts do not name every shape the facade accepts: plain JSON, as sent.
    return cast(Any, screenshot_tool_input(image_url))


def engine_call(recorder: EngineRecorder, response_id: str) -> RecordedCall:
    """The GenerateRequest the engine received for a response, with the engine's result."""
    calls = [call for call in recorder.recording.calls if call.request.request_id == response_id]
    assert len(calls) == 1, f"{len(calls)} engine calls for {response_id}"
    assert calls[0].result is not None, "the engine sent no result"
    return calls[0]


def engine_log_line(engine: ServiceProcess, response_id: str) -> str:
    # The engine logs a request's line when it retires it, just after sending the result: on a
    # loaded machine the client can have its answer before the line is written.
    deadline = time.monotonic() + 30
    while True:
        lines = [line for line in engine.log().splitlines() if f"request {response_id}:" in line]
        if lines or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(lines) == 1, lines
    return lines[0]


def assert_ended_within_the_limit(response: Response) -> None:
    """Finished by the model (a trained fixture) or, for the random one, by `max_output_tokens`."""
    assert response.usage is not None
    assert response.usage.total_tokens == response.usage.input_tokens + response.usage.output_tokens
    if response.status == "completed":
        assert 0 < response.usage.output_tokens <= MAX_TOKENS
        return
    assert response.status == "incomplete"
    assert response.incomplete_details is not None
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == MAX_TOKENS


def kinds(message: pb.Message) -> list[str]:
    return [str(part.WhichOneof("kind")) for part in message.parts]


# -- the SDK against the session stack ------------------------------------------------------------


def test_create_text_validates_against_the_schema(sdk: openai.OpenAI) -> None:
    raw = sdk.responses.with_raw_response.create(
        model="default", input="Say hello.", max_output_tokens=MAX_TOKENS
    )
    assert raw.http_response.status_code == 200
    assert_valid(raw.http_response.json(), "ResponseResource")
    response = raw.parse()
    [model] = sdk.models.list().data
    assert response.model == model.id
    assert_ended_within_the_limit(response)
    assert response.output_text


def test_create_with_user_input_image(sdk: openai.OpenAI) -> None:
    text = {"type": "input_text", "text": "What colour is this?"}
    image = {"type": "input_image", "image_url": png_data_url(BLUE), "detail": "low"}
    with_image = sdk.responses.create(
        model="default",
        input=cast(Any, [{"role": "user", "content": [text, image]}]),
        max_output_tokens=MAX_TOKENS,
    )
    assert_ended_within_the_limit(with_image)
    assert with_image.usage is not None
    text_only = sdk.responses.input_tokens.count(
        model="default", input=cast(Any, [{"role": "user", "content": [text]}])
    )
    # The image's tokens are in the prompt the engine counted.
    assert with_image.usage.input_tokens > text_only.input_tokens


def test_create_with_a_screenshot_tool_output(sdk: openai.OpenAI) -> None:
    response = sdk.responses.create(
        model="default", input=screenshot_input(png_data_url(RED)), tools=TOOLS, max_output_tokens=MAX_TOKENS
    )
    assert_ended_within_the_limit(response)
    assert [tool.model_dump()["name"] for tool in response.tools] == ["screenshot"]
    counted = sdk.responses.input_tokens.count(
        model="default", input=screenshot_input(png_data_url(RED)), tools=TOOLS
    )
    assert response.usage is not None and response.usage.input_tokens == counted.input_tokens


def test_create_stream_true_runs_to_its_terminal_event(sdk: openai.OpenAI) -> None:
    stream = sdk.responses.create(
        model="default",
        input=screenshot_input(png_data_url(RED)),
        tools=TOOLS,
        max_output_tokens=MAX_TOKENS,
        stream=True,
    )
    events = list(stream)
    assert [event.sequence_number for event in events] == list(range(len(events)))
    assert [event.type for event in events[:2]] == ["response.created", "response.in_progress"]
    final = events[-1]
    assert final.type in ("response.completed", "response.incomplete")
    assert_ended_within_the_limit(final.response)
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == final.response.output_text
    assert sdk.responses.retrieve(final.response.id).output_text == deltas


def test_retrieve_input_items_and_delete(sdk: openai.OpenAI) -> None:
    user_image = png_data_url(BLUE)
    tool_image = png_data_url(RED)
    items = screenshot_tool_input(tool_image)
    items[0]["content"].append({"type": "input_image", "image_url": user_image})
    items[2]["output"][1]["detail"] = "high"
    created = sdk.responses.create(
        model="default", input=cast(Any, items), tools=TOOLS, max_output_tokens=MAX_TOKENS
    )

    retrieved = sdk.responses.retrieve(created.id)
    assert retrieved.model_dump() == created.model_dump()

    listed = [item.model_dump() for item in sdk.responses.input_items.list(created.id, order="asc")]
    assert [item["type"] for item in listed] == ["message", "function_call", "function_call_output"]
    user_parts = listed[0]["content"]
    assert [part["type"] for part in user_parts] == ["input_text", "input_image"]
    # Images come back as sent (never ""), with `detail` on every one.
    assert (user_parts[1]["image_url"], user_parts[1]["detail"]) == (user_image, "auto")
    output = listed[2]["output"]
    assert [part["type"] for part in output] == ["input_text", "input_image"]
    assert (output[1]["image_url"], output[1]["detail"]) == (tool_image, "high")
    newest_first = [item.id for item in sdk.responses.input_items.list(created.id)]
    assert newest_first == [item["id"] for item in reversed(listed)]

    sdk.responses.delete(created.id)  # returns nothing; a failure raises
    with pytest.raises(openai.NotFoundError) as missing:
        sdk.responses.retrieve(created.id)
    assert missing.value.status_code == 404
    with pytest.raises(openai.NotFoundError):
        sdk.responses.input_items.list(created.id)


# -- streams that complete: the squares model --------------------------------------------------------


@pytest.fixture(scope="module")
def squares_sdk(squares_facade_url: str) -> Iterator[openai.OpenAI]:
    client = sdk_client(squares_facade_url)
    yield client
    client.close()


def squares_question() -> Any:
    sample = draw_sample(random.Random(3))
    content = [{"type": "input_text", "text": QUESTION}, squares.input_image(sample)]
    return cast(Any, [{"type": "message", "role": "user", "content": content}])


def test_stream_helper_to_get_final_response(squares_sdk: openai.OpenAI) -> None:
    with squares_sdk.responses.stream(
        model="default", input=squares_question(), max_output_tokens=SQUARES_MAX_TOKENS
    ) as stream:
        deltas = [event.delta for event in stream if event.type == "response.output_text.delta"]
        final = stream.get_final_response()
    assert final.status == "completed"
    assert "".join(deltas) == final.output_text != ""
    assert squares_sdk.responses.retrieve(final.id).output_text == final.output_text


def test_create_stream_true_to_the_completed_response(squares_sdk: openai.OpenAI) -> None:
    sample = draw_sample(random.Random(4))
    stream = squares_sdk.responses.create(
        model="default",
        input=cast(Any, squares.agent_input(squares.captured_with_image(sample))),
        tools=cast(Any, [squares.SCREENSHOT_TOOL]),
        max_output_tokens=SQUARES_MAX_TOKENS,
        stream=True,
    )
    events = list(stream)
    assert [event.sequence_number for event in events] == list(range(len(events)))
    final = events[-1]
    assert isinstance(final, ResponseCompletedEvent)
    assert final.response.status == "completed"
    deltas = "".join(event.delta for event in events if event.type == "response.output_text.delta")
    assert deltas == final.response.output_text


# -- what the engine received -------------------------------------------------------------------------


def test_a_screenshot_tool_output_reaches_the_engine_as_tool_text_then_one_user_image(
    recorded_sdk: openai.OpenAI, engine_recorder: EngineRecorder, engine_process: ServiceProcess
) -> None:
    response = recorded_sdk.responses.create(
        model="default", input=screenshot_input(png_data_url(RED)), tools=TOOLS, max_output_tokens=MAX_TOKENS
    )
    call = engine_call(engine_recorder, response.id)
    # Sent as the client gave it (the image inside the tool output); the engine lowers it.
    assert call.request.messages[2].tool_output.WhichOneof("output") == "parts"
    messages = lower_messages(call.request.messages)
    assert [m.role for m in messages] == [pb.ROLE_USER, pb.ROLE_ASSISTANT, pb.ROLE_TOOL, pb.ROLE_USER]
    assert [(c.id, c.name) for c in messages[1].tool_calls] == [("c1", "screenshot")]
    tool_text = messages[2].tool_output.text
    assert tool_text.startswith("captured") and tool_text.endswith(IMAGE_FOLLOW_UP_MARKER)
    assert kinds(messages[3]) == ["image"]
    assert messages[3].parts[0].image.data == png_bytes(RED)
    assert call.result is not None
    assert call.result.usage.image_count == 1
    assert response.usage is not None
    assert response.usage.input_tokens == call.result.usage.input_tokens
    # The engine's own log line agrees.
    assert re.search(r" images=1 ", engine_log_line(engine_process, response.id))
    counted = recorded_sdk.responses.input_tokens.count(
        model="default", input=screenshot_input(png_data_url(RED)), tools=TOOLS
    )
    assert counted.input_tokens == response.usage.input_tokens


def test_input_image_and_chat_image_url_give_the_same_engine_request(
    recorded_facade: ServiceProcess, engine_recorder: EngineRecorder
) -> None:
    image = png_data_url(BLUE)
    parts = [
        [
            {"type": "input_text", "text": "Colour?"},
            {"type": "input_image", "image_url": image, "detail": "high"},
        ],
        [
            {"type": "text", "text": "Colour?"},
            {"type": "image_url", "image_url": {"url": image, "detail": "high"}},
        ],
    ]
    requests = []
    with httpx.Client(base_url=recorded_facade.address, timeout=60) as http:
        for content in parts:
            body = {
                "model": "default",
                "input": [{"role": "user", "content": content}],
                "max_output_tokens": 2,
            }
            answer = http.post("/v1/responses", json=body)
            assert answer.status_code == 200, answer.text
            request = pb.GenerateRequest()
            request.CopyFrom(engine_call(engine_recorder, answer.json()["id"]).request)
            request.request_id = ""
            requests.append(request)
    assert requests[0] == requests[1]
    assert kinds(requests[0].messages[0]) == ["text", "image"]
    assert requests[0].messages[0].parts[1].image.detail == pb.IMAGE_DETAIL_HIGH


def test_previous_response_id_replays_the_stored_tool_image(
    recorded_sdk: openai.OpenAI, engine_recorder: EngineRecorder
) -> None:
    first = recorded_sdk.responses.create(
        model="default", input=screenshot_input(png_data_url(RED)), tools=TOOLS, max_output_tokens=MAX_TOKENS
    )
    new_items: Any = [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_text", "text": "And this one?"},
                {"type": "input_image", "image_url": png_data_url(BLUE)},
            ],
        }
    ]
    follow_up = recorded_sdk.responses.create(
        model="default",
        previous_response_id=first.id,
        input=new_items,
        tools=TOOLS,
        max_output_tokens=MAX_TOKENS,
    )
    original = engine_call(engine_recorder, first.id)
    replayed = engine_call(engine_recorder, follow_up.id)
    # The stored turns are sent again exactly as the first time (image bytes included), then
    # the first answer, then the new user turn with its own image.
    replayed_messages = list(replayed.request.messages)
    assert replayed_messages[:3] == list(original.request.messages)
    assert [m.role for m in replayed_messages[3:]] == [pb.ROLE_ASSISTANT, pb.ROLE_USER]
    assert replayed_messages[3].parts[0].text.text == first.output_text
    assert kinds(replayed_messages[4]) == ["text", "image"]
    assert replayed_messages[4].parts[1].image.data == png_bytes(BLUE)
    assert replayed.result is not None and replayed.result.usage.image_count == 2

    # Token counts: the replayed request is the original's prompt plus the new items.
    assert follow_up.usage is not None
    assert follow_up.usage.input_tokens == replayed.result.usage.input_tokens
    by_reference = recorded_sdk.responses.input_tokens.count(
        model="default", previous_response_id=first.id, input=new_items, tools=TOOLS
    )
    spelled_out = recorded_sdk.responses.input_tokens.count(
        model="default",
        input=cast(
            Any,
            [
                *screenshot_tool_input(png_data_url(RED)),
                *(item.model_dump() for item in first.output),
                *new_items,
            ],
        ),
        tools=TOOLS,
    )
    assert by_reference.input_tokens == spelled_out.input_tokens == follow_up.usage.input_tokens
    assert first.usage is not None and follow_up.usage.input_tokens > first.usage.input_tokens


@pytest.mark.parametrize("truncation", ["disabled", "auto"])
def test_over_long_input_is_a_400_naming_the_context_length(facade_url: str, truncation: str) -> None:
    info = httpx.get(f"{facade_url}/v1/models/default", timeout=30).json()
    context = info["vlmserve"]["context_length"]
    body = {"model": "default", "input": "word " * (context + 1000), "truncation": truncation}
    reply = httpx.post(f"{facade_url}/v1/responses", json=body, timeout=120)
    assert reply.status_code == 400, reply.text[:500]
    error = reply.json()["error"]
    assert (error["code"], error["param"]) == ("context_length_exceeded", "input")
    assert str(context) in error["message"]
