"""`POST /v1/responses/compact` with the openai SDK (`client.responses.compact`) on the real stack:
the model's summary as a `compaction` item plus the kept recent items, which a later
`responses.create` takes as input; what reaches the engine is shown by the recording hop."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import openai
import pytest

from tests._engine_recorder import EngineRecorder
from tests._services import ServiceProcess
from tests.facade.helpers import png_data_url
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.responses import SUMMARY_INSTRUCTION

SUMMARY_HEADING = "Summary of the conversation so far:\n"


@pytest.fixture(scope="module")
def sdk(recorded_facade: ServiceProcess) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{recorded_facade.address}/v1", api_key="x", max_retries=0, timeout=120)
    yield client
    client.close()


def engine_request(recorder: EngineRecorder, response_id: str) -> pb.GenerateRequest:
    [call] = [call for call in recorder.recording.calls if call.request.request_id == response_id]
    return call.request


def texts(message: pb.Message) -> list[str]:
    return [part.text.text for part in message.parts if part.WhichOneof("kind") == "text"]


CONVERSATION: Any = [
    {"role": "user", "content": "My name is Alice and I like red squares."},
    {"role": "assistant", "content": "Hello Alice!"},
    {
        "role": "user",
        "content": [
            {"type": "input_text", "text": "How many squares are in this picture?"},
            {"type": "input_image", "image_url": png_data_url((255, 0, 0), (32, 32))},
        ],
    },
]


def test_compact_then_continue(sdk: openai.OpenAI, engine_recorder: EngineRecorder) -> None:
    compacted = sdk.responses.compact(model="default", input=CONVERSATION)
    assert compacted.object == "response.compaction"
    assert compacted.usage.input_tokens > 0 and compacted.usage.output_tokens > 0
    first, *kept = compacted.output
    assert first.type == "compaction" and first.id.startswith("cmp_")
    assert first.encrypted_content
    # The kept recent items: the last user turn, its image with it.
    [user] = kept
    assert user.type == "message" and user.role == "user"
    # The summarising call saw the whole conversation, then the request for a summary.
    summarising = engine_request(engine_recorder, compacted.id)
    assert [m.role for m in summarising.messages] == [
        pb.ROLE_USER,
        pb.ROLE_ASSISTANT,
        pb.ROLE_USER,
        pb.ROLE_USER,
    ]
    assert texts(summarising.messages[-1]) == [SUMMARY_INSTRUCTION]
    # A later request takes the compacted list as its input.
    later_input: Any = [item.model_dump(exclude_none=True) for item in compacted.output]
    later_input.append({"role": "user", "content": "And what is my name?"})
    later = sdk.responses.create(model="default", input=later_input, max_output_tokens=16)
    assert later.status in ("completed", "incomplete")
    received = engine_request(engine_recorder, later.id).messages
    assert [m.role for m in received] == [pb.ROLE_ASSISTANT, pb.ROLE_USER, pb.ROLE_USER]
    [heading] = texts(received[0])
    assert heading.startswith(SUMMARY_HEADING) and len(heading) > len(SUMMARY_HEADING)
    assert [part.WhichOneof("kind") for part in received[1].parts] == ["text", "image"]
    assert texts(received[2]) == ["And what is my name?"]


def test_compact_a_stored_chain(sdk: openai.OpenAI, engine_recorder: EngineRecorder) -> None:
    first = sdk.responses.create(model="default", input="My name is Alice.", max_output_tokens=8)
    compacted = sdk.responses.compact(model="default", previous_response_id=first.id)
    assert [item.type for item in compacted.output] == ["compaction"]
    summarising = engine_request(engine_recorder, compacted.id).messages
    # The stored turn (question and answer), then the request for a summary.
    assert texts(summarising[0]) == ["My name is Alice."]
    assert summarising[1].role == pb.ROLE_ASSISTANT
    assert texts(summarising[-1]) == [SUMMARY_INSTRUCTION]


def test_a_foreign_compaction_item_is_a_400(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.create(
            model="default",
            input=[{"type": "compaction", "id": "cmp_1", "encrypted_content": "gAAAAABpM0Yj"}],
        )
    assert refused.value.body["param"] == "input[0].encrypted_content"  # type: ignore[index]


def test_compact_refuses_what_it_does_not_know(sdk: openai.OpenAI) -> None:
    with pytest.raises(openai.BadRequestError) as refused:
        sdk.responses.compact(model="default", input="hi", extra_body={"temperature": 0.1})
    assert refused.value.body["param"] == "temperature"  # type: ignore[index]
    with pytest.raises(openai.BadRequestError):
        sdk.responses.compact(model="default")


def test_a_compaction_trigger_round_trip_on_the_real_stack(
    sdk: openai.OpenAI, engine_recorder: EngineRecorder
) -> None:
    """compaction_trigger (issue 36.1): the real model summarises, the item comes back sealed, the
    next turn expands it (summary, the kept screenshot) and is answered."""
    trigger: Any = {"type": "compaction_trigger"}
    compacted = sdk.responses.create(model="default", input=[*CONVERSATION, trigger])
    assert compacted.status == "completed"
    [item] = compacted.output
    assert item.type == "compaction" and item.encrypted_content.startswith("vlmserve.compaction.v2.")  # type: ignore[union-attr]
    after = sdk.responses.create(
        model="default",
        input=[item.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}],  # type: ignore[list-item]
        max_output_tokens=8,
    )
    assert after.status in ("completed", "incomplete")
    sent = engine_request(engine_recorder, after.id)
    assert texts(sent.messages[0])[0].startswith(SUMMARY_HEADING)
    kept = [part for part in sent.messages[1].parts if part.WhichOneof("kind") == "image"]
    assert len(kept) == 1 and texts(sent.messages[-1]) == ["Go on."]
