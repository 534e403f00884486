"""The stored assistant turn is built from the response's typed output (no JSON round trip), and
it is the turn a client replaying those output items as JSON input gets: one rule, two entries."""

from __future__ import annotations

from typing import Any

import pytest

from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.responses import (
    CustomToolCallItem,
    FunctionCallItem,
    LogProb,
    OutputItem,
    OutputMessage,
    OutputTextContent,
    ReasoningItem,
    ReasoningTextContent,
)
from vlmserve.responses._items import items_to_messages, output_items_to_messages
from vlmserve.responses._media import MediaPolicy


def message(*texts: str, item_id: str = "msg_1") -> OutputMessage:
    return OutputMessage(
        id=item_id, status="completed", content=[OutputTextContent(text=text) for text in texts]
    )


def thinking(*texts: str, summary: list[str] | None = None) -> ReasoningItem:
    return ReasoningItem(
        id="rs_1",
        content=[ReasoningTextContent(text=text) for text in texts],
        summary=[{"type": "summary_text", "text": text} for text in summary or []],
    )


def call(call_id: str, name: str = "get_weather", namespace: str | None = None) -> FunctionCallItem:
    return FunctionCallItem(
        id=f"fc_{call_id}", call_id=call_id, name=name, arguments='{"city":"Paris"}', namespace=namespace
    )


def custom(call_id: str, namespace: str | None = None) -> CustomToolCallItem:
    return CustomToolCallItem(
        id=f"ctc_{call_id}", call_id=call_id, name="apply_patch", input="*** Begin Patch", namespace=namespace
    )


def namer(namespace: str | None, name: str) -> str:
    return name if namespace is None else f"{namespace}__{name}"


CASES: dict[str, list[Any]] = {
    "text": [message("The answer is 4.")],
    "two parts and an empty one": [message("a", "", "b")],
    "thinking then text": [thinking("Two and two.", "Four."), message("4")],
    "summary only": [thinking(summary=["short", ""]), message("4")],
    "empty thinking": [thinking(""), message("4")],
    "thinking alone is dropped": [thinking("nothing follows")],
    "text then calls join its turn": [message("Checking."), call("c1"), call("c2")],
    "a call alone opens a turn": [call("c1")],
    "thinking between text and a call opens a turn": [message("Checking."), thinking("hm"), call("c1")],
    "namespaced calls keep their offered name": [
        call("c1", namespace="weather"),
        custom("c2", namespace="fs"),
    ],
    "custom tool call": [thinking("patch it"), custom("c1")],
    "logprobs are not part of the turn": [
        OutputMessage(
            id="msg_2",
            status="incomplete",
            content=[OutputTextContent(text="4", logprobs=[LogProb(token="4", logprob=-0.1, bytes=[52])])],
        )
    ],
    "nothing": [],
}


@pytest.mark.parametrize("items", list(CASES.values()), ids=list(CASES))
def test_typed_output_gives_the_turn_its_json_replay_gives(items: list[OutputItem]) -> None:
    typed = output_items_to_messages(items, call_name=namer)
    entries = [(f"output[{index}]", item.to_json()) for index, item in enumerate(items)]
    assert typed == items_to_messages(entries, media=MediaPolicy(), call_name=namer)


def test_the_turn_itself() -> None:
    """What the table's agreement means, spelled out once."""
    turn = output_items_to_messages(
        [thinking("Two and two."), message("Checking."), call("c1", namespace="weather")], call_name=namer
    )
    assert turn == [
        pb.Message(
            role=pb.ROLE_ASSISTANT,
            parts=[pb.Part(text=pb.TextPart(text="Checking."))],
            reasoning_text="Two and two.",
            tool_calls=[
                pb.ToolCall(
                    id="c1",
                    name="weather__get_weather",
                    arguments='{"city":"Paris"}',
                    kind=pb.TOOL_KIND_FUNCTION,
                )
            ],
        )
    ]
