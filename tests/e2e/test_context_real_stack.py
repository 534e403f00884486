"""Context management on the real stack (issue 36, what the engine decides): the turn after a
`compaction_trigger` starts warm (its `cached_tokens` cover the prewarmed compacted prefix), the
compaction turn is stored and continued by `previous_response_id`, Anthropic `count_tokens`
counts the edited prompt as `/v1/messages` sends it, and, on a small-context copy of the tiny
model, a chained turn that would not fit is compacted without `context_management` (and is
the engine's 400 with `context_management: []`)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests._engine_recorder import EngineRecorder, RecordedCall
from tests._fixture_models import small_context_model
from tests._services import ServiceProcess, start_engine, start_facade
from tests.e2e.test_compaction_real_stack import CONVERSATION, SUMMARY_HEADING, engine_request, texts
from vlmserve.engine.v1 import engine_pb2 as pb

pytestmark = pytest.mark.slow

TRIGGER: Any = {"type": "compaction_trigger"}
SMALL_CONTEXT = 1024
# Template tokens around where a prompt ending with the generation prompt and one going on with
# a user turn part.
TEMPLATE_TAIL = 4


@pytest.fixture(scope="module")
def sdk(recorded_facade: ServiceProcess) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{recorded_facade.address}/v1", api_key="x", max_retries=0, timeout=120)
    yield client
    client.close()


def call_after(recorder: EngineRecorder, response_id: str) -> RecordedCall:
    """The engine call made right after the one of `response_id` (its prewarm)."""
    calls = recorder.recording.calls
    index = next(i for i, call in enumerate(calls) if call.request.request_id == response_id)
    return calls[index + 1]


def test_the_turn_after_a_compaction_starts_warm(sdk: openai.OpenAI, engine_recorder: EngineRecorder) -> None:
    compacted = sdk.responses.create(model="default", input=[*CONVERSATION, TRIGGER])
    [item] = compacted.output
    # Prefilled before the answer went out: the summary and the kept screenshot.
    warming = call_after(engine_recorder, compacted.id)
    assert warming.request.sampling.max_tokens == 1 and warming.result is not None
    assert [m.role for m in warming.request.messages] == [pb.ROLE_ASSISTANT, pb.ROLE_USER]
    assert texts(warming.request.messages[0])[0].startswith(SUMMARY_HEADING)
    prefix = warming.result.usage.input_tokens
    after = sdk.responses.create(
        model="default",
        input=[item.model_dump(exclude_none=True), {"role": "user", "content": "Go on."}],  # type: ignore[list-item]
        max_output_tokens=8,
    )
    assert after.usage is not None
    cached = after.usage.input_tokens_details.cached_tokens
    # The whole compacted prefix (summary, kept screenshot) but the few template tokens around
    # where the two prompts part: the prewarm's generation prompt (`<|im_start|>assistant\n`)
    # against the next user turn (4 on the tiny model; without the prewarm, 0 were cached).
    assert cached >= prefix - TEMPLATE_TAIL, (cached, prefix, after.usage)
    assert after.usage.input_tokens > cached


def test_the_compaction_turn_is_stored_and_continues(
    sdk: openai.OpenAI, engine_recorder: EngineRecorder
) -> None:
    compacted = sdk.responses.create(model="default", input=[*CONVERSATION, TRIGGER])
    stored = sdk.responses.retrieve(compacted.id)
    assert [item.type for item in stored.output] == ["compaction"]
    assert stored.output[0].encrypted_content == compacted.output[0].encrypted_content  # type: ignore[union-attr]
    listed = list(sdk.responses.input_items.list(compacted.id, order="asc"))
    assert listed[-1].type == "compaction_trigger" and len(listed) == len(CONVERSATION) + 1  # type: ignore[comparison-overlap]
    later = sdk.responses.create(
        model="default", previous_response_id=compacted.id, input="And now?", max_output_tokens=8
    )
    sent = engine_request(engine_recorder, later.id).messages
    # From the summary on: the compacted turns are not sent again.
    assert [m.role for m in sent] == [pb.ROLE_ASSISTANT, pb.ROLE_USER, pb.ROLE_USER]
    assert texts(sent[0])[0].startswith(SUMMARY_HEADING) and texts(sent[2]) == ["And now?"]


def test_count_tokens_counts_the_edited_prompt(recorded_facade: ServiceProcess) -> None:
    client = anthropic.Anthropic(base_url=recorded_facade.address, api_key="x", max_retries=0, timeout=120)
    messages: list[Any] = [{"role": "user", "content": "Read the three files."}]
    for n in range(3):
        messages.append(
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": f"t{n}", "name": "Read", "input": {}}],
            }
        )
        result = {
            "type": "tool_result",
            "tool_use_id": f"t{n}",
            "content": f"file {n}: " + "lorem ipsum " * 40,
        }
        messages.append({"role": "user", "content": [result]})
    tools: Any = [{"name": "Read", "input_schema": {"type": "object"}}]
    edits: Any = {
        "edits": [
            {
                "type": "clear_tool_uses_20250919",
                "trigger": {"type": "input_tokens", "value": 1},
                "keep": {"type": "tool_uses", "value": 1},
            }
        ]
    }
    counted = client.beta.messages.count_tokens(
        model="default", messages=messages, tools=tools, context_management=edits
    )
    assert counted.context_management is not None
    original = counted.context_management.original_input_tokens
    # Two results of ~80 tokens each cleared.
    assert original - counted.input_tokens > 100
    # What /v1/messages then sends is what was counted.
    sent = client.beta.messages.create(
        model="default", max_tokens=4, messages=messages, tools=tools, context_management=edits
    )
    assert sent.usage.input_tokens + (sent.usage.cache_read_input_tokens or 0) == counted.input_tokens
    plain = client.messages.count_tokens(model="default", messages=messages, tools=tools)
    assert plain.input_tokens == original
    client.close()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[openai.OpenAI]:
    folder = tmp_path_factory.mktemp("small-context")
    engine = start_engine(folder, model=str(small_context_model(SMALL_CONTEXT, folder)))
    try:
        facade = start_facade(folder, engine.address, store_path=folder / "responses.sqlite3")
        client = openai.OpenAI(base_url=f"{facade.address}/v1", api_key="x", max_retries=0, timeout=300)
        try:
            yield client
        finally:
            client.close()
            facade.stop()
    finally:
        engine.stop()


def long_text(tag: str) -> str:
    # More than half the small context, so that one turn fits and two do not.
    return " ".join([tag] * 200)


def test_a_chained_turn_that_would_not_fit_is_compacted(small: openai.OpenAI) -> None:
    first = small.responses.create(model="default", input=long_text("alpha"), max_output_tokens=8)
    assert first.usage is not None and first.usage.input_tokens > SMALL_CONTEXT // 2
    later = small.responses.create(
        model="default", previous_response_id=first.id, input=long_text("beta"), max_output_tokens=8
    )
    assert later.output[0].type == "compaction", (first.usage, later.usage)
    assert later.status in ("completed", "incomplete")
    assert later.usage is not None and later.usage.input_tokens < SMALL_CONTEXT
    # Opted out: the prompt is sent as it is, and the engine's clear 400 says it is too long.
    with pytest.raises(openai.BadRequestError) as refused:
        small.responses.create(
            model="default",
            previous_response_id=first.id,
            input=long_text("beta"),
            max_output_tokens=8,
            extra_body={"context_management": []},
        )
    assert refused.value.code == "context_length_exceeded", refused.value.body
