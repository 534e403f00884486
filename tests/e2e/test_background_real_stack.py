"""Background responses on the real stack, through the official `openai` SDK: create with
`background=True`, poll with `responses.retrieve`, stop with `responses.cancel`, and resume the
stored events with `responses.retrieve(id, stream=True, starting_after=N)`.

`random_facade_url` serves the random-weight tiny model, which never ends a turn by itself: a run
goes on until its `max_output_tokens`, so it is still running when it is cancelled.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import httpx
import openai
import pytest

from tests.facade.helpers import EVENT_SCHEMAS, assert_valid, stream_events

WAIT_S = 120.0
SHORT_TOKENS = 6
LONG_TOKENS = 4000


@pytest.fixture(scope="module")
def sdk(random_facade_url: str) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{random_facade_url}/v1", api_key="x", max_retries=0, timeout=WAIT_S)
    yield client
    client.close()


def poll(sdk: openai.OpenAI, response_id: str, *statuses: str) -> Any:
    deadline = time.monotonic() + WAIT_S
    while True:
        response = sdk.responses.retrieve(response_id)
        if response.status in statuses:
            return response
        assert time.monotonic() < deadline, f"{response_id} still {response.status}"
        time.sleep(0.05)


def raw_events(random_facade_url: str, response_id: str, after: int | None = None) -> list[dict[str, Any]]:
    """The resumed stream as sent, each event checked against the Open Responses schema."""
    query = "" if after is None else f"&starting_after={after}"
    answer = httpx.get(f"{random_facade_url}/v1/responses/{response_id}?stream=true{query}", timeout=WAIT_S)
    assert answer.status_code == 200, answer.text
    events = stream_events(answer.text)
    for event in events:
        assert_valid(event, EVENT_SCHEMAS[event["type"]])
    return events


def test_background_created_polled_and_resumed(sdk: openai.OpenAI, random_facade_url: str) -> None:
    created = sdk.responses.create(
        model="default", input="Say something.", background=True, max_output_tokens=SHORT_TOKENS
    )
    assert created.status == "queued" and created.background is True
    done = poll(sdk, created.id, "completed", "incomplete", "failed", "cancelled")
    assert done.status == "incomplete" and done.incomplete_details.reason == "max_output_tokens"
    assert done.usage.output_tokens == SHORT_TOKENS

    # The whole run replays from the store, through the SDK and as sent.
    replayed = list(sdk.responses.retrieve(created.id, stream=True))
    events = raw_events(random_facade_url, created.id)
    assert [event.sequence_number for event in replayed] == [event["sequence_number"] for event in events]
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    assert events[0]["type"] == "response.created" and events[0]["response"]["status"] == "queued"
    assert events[-1]["type"] == "response.incomplete"
    assert events[-1]["response"] == httpx.get(f"{random_facade_url}/v1/responses/{created.id}").json()
    text = "".join(event["delta"] for event in events if event["type"] == "response.output_text.delta")
    assert text == done.output_text

    # Resumed after N: exactly the events after N.
    after = len(events) // 2
    resumed = list(sdk.responses.retrieve(created.id, stream=True, starting_after=after))
    assert [event.sequence_number for event in resumed] == list(range(after + 1, len(events)))
    assert resumed[-1].type == "response.incomplete"


def test_background_cancelled_while_running(sdk: openai.OpenAI, random_facade_url: str) -> None:
    created = sdk.responses.create(
        model="default", input="Write a very long story.", background=True, max_output_tokens=LONG_TOKENS
    )
    running = poll(sdk, created.id, "in_progress", "completed", "incomplete", "failed", "cancelled")
    assert running.status == "in_progress"
    # A follower that joins mid-run gets the stored events, then the live ones, to the end.
    with sdk.responses.retrieve(created.id, stream=True, starting_after=0) as stream:
        first = next(iter(stream))
        assert first.sequence_number == 1
        cancelled = sdk.responses.cancel(created.id)
        rest = list(stream)
    assert cancelled.status == "cancelled"
    assert rest[-1].type == "response.incomplete"
    assert rest[-1].response.status == "cancelled"
    stored = sdk.responses.retrieve(created.id)
    assert stored.status == "cancelled"
    # Usage is the engine's count at the cancel; when the engine's final result does not come
    # back in time (a loaded machine) the call is closed and the response has none, as OpenAI's
    # cancelled responses may not.
    assert stored.usage is None or stored.usage.output_tokens < LONG_TOKENS
    events = raw_events(random_facade_url, created.id)
    assert events[-1]["type"] == "response.incomplete"
    assert [event["sequence_number"] for event in events] == list(range(len(events)))
    # A foreground response cannot be cancelled, as with OpenAI.
    foreground = sdk.responses.create(model="default", input="hi", max_output_tokens=1)
    with pytest.raises(openai.BadRequestError):
        sdk.responses.cancel(foreground.id)
