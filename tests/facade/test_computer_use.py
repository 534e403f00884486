"""Computer use on the Responses API (issue 35, docs/computer-use.md), against the fake engine:
the tools reach the engine as its ComputerTool, computer calls go out as `computer_call` items
(whole and streamed), screenshots come back as `computer_call_output` items lowered exactly as a
function call's image, and replays keep them. Bad input is a 400 naming the field."""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from tests.facade.fake_engine import FakeEngine, Script
from tests.facade.helpers import png_data_url, stream_events
from vlmserve.engine.prep.lowering import lower_messages
from vlmserve.engine.v1 import engine_pb2 as pb

CLICK = {"type": "click", "button": "left", "x": 40, "y": 30}
PREVIEW = {
    "type": "computer_use_preview",
    "display_width": 1024,
    "display_height": 768,
    "environment": "linux",
}


def computer_call(action: dict[str, Any], call_id: str = "call_cu_1") -> pb.ToolCall:
    return pb.ToolCall(id=call_id, name="computer", arguments=json.dumps(action), kind=pb.TOOL_KIND_COMPUTER)


def screenshot_item(call_id: str = "call_cu_1", image_url: str | None = None) -> dict[str, Any]:
    return {
        "type": "computer_call_output",
        "call_id": call_id,
        "output": {
            "type": "computer_screenshot",
            "image_url": image_url or png_data_url((0, 0, 255), (64, 48)),
        },
        "acknowledged_safety_checks": [],
    }


def replayed_call(action: dict[str, Any], call_id: str = "call_cu_1") -> dict[str, Any]:
    return {
        "type": "computer_call",
        "call_id": call_id,
        "action": action,
        "pending_safety_checks": [],
        "status": "completed",
    }


@pytest.mark.parametrize("tool", [{"type": "computer"}, PREVIEW])
async def test_the_tool_reaches_the_engine_and_a_call_comes_back_as_a_computer_call(
    http: httpx.AsyncClient, engine: FakeEngine, tool: dict[str, Any]
) -> None:
    engine.script = Script(
        text_chunks=[], tool_calls=[computer_call(CLICK)], finish_reason=pb.FINISH_REASON_TOOL_CALLS
    )
    reply = await http.post("/v1/responses", json={"model": "default", "input": "Click it.", "tools": [tool]})
    assert reply.status_code == 200, reply.text
    sent = engine.requests[-1].tools
    assert [t.WhichOneof("kind") for t in sent] == ["computer"]
    if tool["type"] == "computer_use_preview":
        assert (sent[0].computer.display_width, sent[0].computer.display_height) == (1024, 768)
        assert sent[0].computer.environment == "linux"
    body = reply.json()
    assert body["tools"] == [tool]
    [item] = body["output"]
    assert item["type"] == "computer_call"
    assert item["id"].startswith("cu")
    assert item["call_id"] == "call_cu_1"
    assert item["action"] == CLICK
    assert item["pending_safety_checks"] == []
    assert item["status"] == "completed"
    # The batched list for the `computer` tool; the preview tool's clients read `action` alone.
    assert item.get("actions") == ([CLICK] if tool["type"] == "computer" else None)


async def test_a_streamed_computer_call_is_added_then_done(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.script = Script(text_chunks=[], tool_calls=[computer_call({"type": "screenshot"})])
    reply = await http.post(
        "/v1/responses",
        json={"model": "default", "input": "Look.", "tools": [{"type": "computer"}], "stream": True},
    )
    events = stream_events(reply.text)
    item_events = [e for e in events if e["type"].startswith("response.output_item")]
    assert [e["type"] for e in item_events] == ["response.output_item.added", "response.output_item.done"]
    assert item_events[0]["item"]["status"] == "in_progress"
    assert item_events[1]["item"]["action"] == {"type": "screenshot"}
    assert not [e for e in events if "arguments" in e["type"]]
    assert events[-1]["response"]["output"][0]["type"] == "computer_call"


async def test_the_screenshot_is_lowered_as_a_function_calls_image(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    image = png_data_url((0, 0, 255), (64, 48))
    computer = [
        {"role": "user", "content": "Click the blue square."},
        replayed_call({"type": "screenshot"}),
        screenshot_item(image_url=image),
    ]
    function = [
        {"role": "user", "content": "Click the blue square."},
        {"type": "function_call", "call_id": "call_cu_1", "name": "computer", "arguments": "{}"},
        {
            "type": "function_call_output",
            "call_id": "call_cu_1",
            "output": [{"type": "input_image", "image_url": image}],
        },
    ]
    for input in (computer, function):
        reply = await http.post(
            "/v1/responses", json={"model": "default", "input": input, "tools": [{"type": "computer"}]}
        )
        assert reply.status_code == 200, reply.text
    computer_request, function_request = engine.requests[-2:]
    call = computer_request.messages[1].tool_calls[0]
    assert (call.kind, json.loads(call.arguments)) == (pb.TOOL_KIND_COMPUTER, {"type": "screenshot"})
    assert computer_request.messages[2].tool_output.kind == pb.TOOL_KIND_COMPUTER
    lowered, expected = lower_messages(computer_request.messages), lower_messages(function_request.messages)
    assert (
        [m.role for m in lowered]
        == [m.role for m in expected]
        == [pb.ROLE_USER, pb.ROLE_ASSISTANT, pb.ROLE_TOOL, pb.ROLE_USER]
    )
    assert (
        lowered[2].tool_output.text
        == expected[2].tool_output.text
        == "[Image output attached in the next message]"
    )
    assert lowered[3].parts[0].image.data == expected[3].parts[0].image.data


async def test_replays_keep_the_calls_and_the_screenshots(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.script = Script(text_chunks=[], tool_calls=[computer_call({"type": "screenshot"})])
    first = (
        await http.post(
            "/v1/responses", json={"model": "default", "input": "Click red.", "tools": [{"type": "computer"}]}
        )
    ).json()
    engine.script = Script(text_chunks=[], tool_calls=[computer_call(CLICK, "call_cu_2")])
    image = png_data_url((255, 0, 0), (64, 48))
    second = await http.post(
        "/v1/responses",
        json={
            "model": "default",
            "previous_response_id": first["id"],
            "input": [screenshot_item(image_url=image)],
            "tools": [{"type": "computer"}],
        },
    )
    assert second.status_code == 200, second.text
    engine.script = Script(text_chunks=["Done."])
    third = await http.post(
        "/v1/responses",
        json={
            "model": "default",
            "previous_response_id": second.json()["id"],
            "input": [screenshot_item("call_cu_2")],
            "tools": [{"type": "computer"}],
        },
    )
    assert third.status_code == 200, third.text
    messages = engine.requests[-1].messages
    calls = [
        json.loads(c.arguments) for m in messages for c in m.tool_calls if c.kind == pb.TOOL_KIND_COMPUTER
    ]
    assert calls == [{"type": "screenshot"}, CLICK]
    images = [
        p.image.data for m in lower_messages(messages) for p in m.parts if p.WhichOneof("kind") == "image"
    ]
    assert len(images) == 2
    listed = (
        await http.get(f"/v1/responses/{second.json()['id']}/input_items", params={"order": "asc"})
    ).json()["data"]
    outputs = [item for item in listed if item["type"] == "computer_call_output"]
    assert outputs and outputs[-1]["output"]["image_url"] == image


@pytest.mark.parametrize(
    ("input", "param"),
    [
        (
            [{"role": "user", "content": "x"}, replayed_call({"type": "fly", "x": 1, "y": 2})],
            "input[1].action.type",
        ),
        (
            [{"role": "user", "content": "x"}, replayed_call({"type": "click", "x": "a", "y": 2})],
            "input[1].action.x",
        ),
        ([{"role": "user", "content": "x"}, screenshot_item("call_nobody")], "input[1].call_id"),
        (
            [
                replayed_call({"type": "screenshot"}),
                screenshot_item(image_url="data:image/png;base64,aGVsbG8="),
            ],
            "input[1].output.image_url",
        ),
        ([{"type": "computer_call", "call_id": "c"}], "input[0].action"),
    ],
)
async def test_bad_computer_input_is_a_400_naming_the_field(
    http: httpx.AsyncClient, input: list[dict[str, Any]], param: str
) -> None:
    reply = await http.post(
        "/v1/responses", json={"model": "default", "input": input, "tools": [{"type": "computer"}]}
    )
    assert reply.status_code == 400, reply.text
    assert reply.json()["error"]["param"] == param


async def test_tool_choice_forces_the_computer(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.script = Script(text_chunks=[], tool_calls=[computer_call({"type": "screenshot"})])
    reply = await http.post(
        "/v1/responses",
        json={
            "model": "default",
            "input": "Look.",
            "tools": [PREVIEW],
            "tool_choice": {"type": "computer_use_preview"},
        },
    )
    assert reply.status_code == 200, reply.text
    assert engine.requests[-1].tool_choice.function_name == "computer"
    refused = await http.post(
        "/v1/responses", json={"model": "default", "input": "Look.", "tool_choice": {"type": "computer"}}
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "tool_choice.type"


# ---- Anthropic Messages: the computer tool ------------------------------------------------------

ANTHROPIC_TOOL = {
    "type": "computer_20250124",
    "name": "computer",
    "display_width_px": 1024,
    "display_height_px": 768,
}


def png_base64(color: tuple[int, int, int] = (0, 0, 255)) -> str:
    return png_data_url(color, (64, 48)).split(",", 1)[1]


@pytest.mark.parametrize("tool_type", ["computer_20250124", "computer_20251124"])
async def test_anthropic_computer_tool_calls_are_tool_use_with_its_actions(
    http: httpx.AsyncClient, engine: FakeEngine, tool_type: str
) -> None:
    engine.script = Script(
        text_chunks=[],
        tool_calls=[computer_call(CLICK, "toolu_1")],
        finish_reason=pb.FINISH_REASON_TOOL_CALLS,
    )
    body = {
        "model": "default",
        "max_tokens": 64,
        "tools": [{**ANTHROPIC_TOOL, "type": tool_type}],
        "messages": [
            {"role": "user", "content": "Click the blue square."},
            {
                "role": "assistant",
                "content": [
                    {
                        "type": "tool_use",
                        "id": "toolu_0",
                        "name": "computer",
                        "input": {"action": "screenshot"},
                    }
                ],
            },
            {
                "role": "user",
                "content": [
                    {
                        "type": "tool_result",
                        "tool_use_id": "toolu_0",
                        "content": [
                            {
                                "type": "image",
                                "source": {"type": "base64", "media_type": "image/png", "data": png_base64()},
                            }
                        ],
                    }
                ],
            },
        ],
    }
    reply = await http.post("/v1/messages", json=body)
    assert reply.status_code == 200, reply.text
    request = engine.requests[-1]
    assert [t.WhichOneof("kind") for t in request.tools] == ["computer"]
    assert (request.tools[0].computer.display_width, request.tools[0].computer.display_height) == (1024, 768)
    replayed = request.messages[1].tool_calls[0]
    assert (replayed.kind, json.loads(replayed.arguments)) == (pb.TOOL_KIND_COMPUTER, {"type": "screenshot"})
    lowered = lower_messages(request.messages)
    assert lowered[-1].parts[0].WhichOneof("kind") == "image"
    message = reply.json()
    assert message["stop_reason"] == "tool_use"
    assert message["content"] == [
        {
            "type": "tool_use",
            "id": "toolu_1",
            "name": "computer",
            "input": {"action": "left_click", "coordinate": [40, 30]},
        }
    ]


async def test_anthropic_computer_call_streams_as_one_tool_use_block(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    engine.script = Script(
        text_chunks=[], tool_calls=[computer_call({"type": "keypress", "keys": ["ctrl", "s"]}, "toolu_2")]
    )
    body = {
        "model": "default",
        "max_tokens": 64,
        "stream": True,
        "tools": [ANTHROPIC_TOOL],
        "messages": [{"role": "user", "content": "Save."}],
    }
    reply = await http.post("/v1/messages", json=body)
    events = [json.loads(line[6:]) for line in reply.text.splitlines() if line.startswith("data: ")]
    blocks = [e for e in events if e["type"].startswith("content_block")]
    assert [e["type"] for e in blocks] == ["content_block_start", "content_block_delta", "content_block_stop"]
    assert blocks[0]["content_block"]["name"] == "computer"
    assert json.loads(blocks[1]["delta"]["partial_json"]) == {"action": "key", "text": "ctrl+s"}
    assert next(e for e in events if e["type"] == "message_delta")["delta"]["stop_reason"] == "tool_use"


def replayed_computer_turn(input: dict[str, Any]) -> dict[str, Any]:
    """A Messages body replaying one computer `tool_use` with `input` and its tool_result."""
    return {
        "model": "default",
        "max_tokens": 16,
        "tools": [ANTHROPIC_TOOL],
        "messages": [
            {"role": "user", "content": "Go."},
            {
                "role": "assistant",
                "content": [{"type": "tool_use", "id": "toolu_9", "name": "computer", "input": input}],
            },
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "toolu_9", "content": "done"}],
            },
        ],
    }


@pytest.mark.parametrize(
    ("input", "expected"),
    [
        (
            {"action": "left_click_drag", "start_coordinate": [1, 2], "coordinate": [30, 40]},
            {"type": "drag", "path": [{"x": 1, "y": 2}, {"x": 30, "y": 40}]},
        ),
        (
            {"action": "scroll", "coordinate": [5, 6], "scroll_direction": "up", "scroll_amount": 3},
            {"type": "scroll", "x": 5, "y": 6, "scroll_x": 0, "scroll_y": -3},
        ),
        (
            {"action": "right_click", "coordinate": [5, 6]},
            {"type": "click", "x": 5, "y": 6, "button": "right"},
        ),
        ({"action": "type", "text": "hello"}, {"type": "type", "text": "hello"}),
        ({"action": "key", "text": "ctrl+c"}, {"type": "keypress", "keys": ["ctrl", "c"]}),
        ({"action": "mouse_move", "coordinate": [5, 6]}, {"type": "move", "x": 5, "y": 6}),
        ({"action": "wait", "duration": 1}, {"type": "wait"}),
    ],
)
async def test_anthropic_replayed_actions_reach_the_engine_as_responses_actions(
    http: httpx.AsyncClient, engine: FakeEngine, input: dict[str, Any], expected: dict[str, Any]
) -> None:
    engine.script = Script(text_chunks=["ok"])
    reply = await http.post("/v1/messages", json=replayed_computer_turn(input))
    assert reply.status_code == 200, reply.text
    assert json.loads(engine.requests[-1].messages[1].tool_calls[0].arguments) == expected


@pytest.mark.parametrize(
    ("input", "param"),
    [
        ({"action": "triple_click", "coordinate": [1, 2]}, "messages[1].content[0].input.action"),
        ({"action": "fly"}, "messages[1].content[0].input.action"),
        ({"action": "left_click", "coordinate": [1]}, "messages[1].content[0].input.coordinate"),
    ],
)
async def test_anthropic_bad_computer_actions_are_400s_naming_them(
    http: httpx.AsyncClient, input: dict[str, Any], param: str
) -> None:
    reply = await http.post("/v1/messages", json=replayed_computer_turn(input))
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    assert param in error["message"]


async def test_a_conversation_keeps_the_calls_and_the_screenshots(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    conversation = (await http.post("/v1/conversations", json={})).json()["id"]
    body: dict[str, Any] = {"model": "default", "conversation": conversation, "tools": [{"type": "computer"}]}
    engine.script = Script(text_chunks=[], tool_calls=[computer_call({"type": "screenshot"})])
    first = await http.post("/v1/responses", json={**body, "input": "Click red."})
    assert first.status_code == 200, first.text
    image = png_data_url((255, 0, 0), (64, 48))
    engine.script = Script(text_chunks=["Done."])
    second = await http.post("/v1/responses", json={**body, "input": [screenshot_item(image_url=image)]})
    assert second.status_code == 200, second.text
    messages = engine.requests[-1].messages
    assert [json.loads(c.arguments) for m in messages for c in m.tool_calls] == [{"type": "screenshot"}]
    assert [
        p.image.data[:8] for m in lower_messages(messages) for p in m.parts if p.WhichOneof("kind") == "image"
    ]
    items = (await http.get(f"/v1/conversations/{conversation}/items", params={"order": "asc"})).json()[
        "data"
    ]
    kinds = [item["type"] for item in items]
    assert "computer_call" in kinds and "computer_call_output" in kinds
    output = next(item for item in items if item["type"] == "computer_call_output")
    assert output["output"]["image_url"] == image
