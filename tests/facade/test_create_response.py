"""POST /v1/responses without streaming: the resource, the engine request, the model alias."""

from __future__ import annotations

import re
from typing import Any

import httpx
import pytest

from tests.facade.fake_engine import MODEL_ID, FakeEngine
from tests.facade.helpers import (
    SCREENSHOT_TOOL,
    assert_valid,
    in_process,
    png_bytes,
    png_data_url,
    screenshot_tool_input,
)
from vlmserve.client import AsyncEngineClient
from vlmserve.engine.prep.lowering import IMAGE_FOLLOW_UP_MARKER, lower_messages
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade import FacadeSettings, Limits, Store, create_app

ID_PATTERN = re.compile(r"^(resp|msg|fc)_[0-9a-f]{48}$")


async def create(http: httpx.AsyncClient, **body: Any) -> httpx.Response:
    body.setdefault("model", "default")
    return await http.post("/v1/responses", json=body)


async def test_text_response_is_a_valid_completed_resource(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    response = await create(http, input="Say hello.")
    assert response.status_code == 200
    body = response.json()
    assert_valid(body, "ResponseResource")
    assert body["status"] == "completed"
    assert body["model"] == MODEL_ID
    assert ID_PATTERN.match(body["id"]) and ID_PATTERN.match(body["output"][0]["id"])
    assert isinstance(body["created_at"], int) and isinstance(body["completed_at"], int)
    assert body["output"][0]["content"][0]["text"] == "Hello, world."
    assert body["usage"]["input_tokens"] == 11 and body["usage"]["total_tokens"] == 14
    assert body["usage"]["input_tokens_details"]["cached_tokens"] == 2
    # The engine got the request under the response's id, for the loaded model.
    (request,) = engine.requests
    assert request.request_id == body["id"] and request.model == MODEL_ID


async def test_request_fields_are_echoed(http: httpx.AsyncClient) -> None:
    response = await create(
        http,
        input="hi",
        instructions="Be brief.",
        temperature=0.5,
        top_p=0.9,
        max_output_tokens=64,
        metadata={"ticket": "42"},
        store=False,
        tools=[SCREENSHOT_TOOL],
        tool_choice="auto",
        parallel_tool_calls=False,
        truncation="disabled",
        text={"format": {"type": "text"}},
    )
    assert response.status_code == 200
    body = response.json()
    assert_valid(body, "ResponseResource")
    expected = {
        "instructions": "Be brief.",
        "temperature": 0.5,
        "top_p": 0.9,
        "max_output_tokens": 64,
        "metadata": {"ticket": "42"},
        "store": False,
        "tool_choice": "auto",
        "parallel_tool_calls": False,
        "truncation": "disabled",
        "text": {"format": {"type": "text"}},
        "previous_response_id": None,
    }
    assert {key: body[key] for key in expected} == expected
    assert [tool["name"] for tool in body["tools"]] == ["screenshot"]


@pytest.mark.parametrize("model", ["default", MODEL_ID, None])
async def test_model_alias_and_id_name_the_loaded_model(http: httpx.AsyncClient, model: str | None) -> None:
    body: dict[str, Any] = {"input": "hi"} if model is None else {"input": "hi", "model": model}
    response = await http.post("/v1/responses", json=body)
    assert response.status_code == 200
    assert response.json()["model"] == MODEL_ID


async def test_unknown_model_is_an_openai_shaped_404(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    response = await create(http, model="gpt-4o", input="hi")
    assert response.status_code == 404
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert error["type"] == "invalid_request_error"
    assert engine.requests == []


async def test_token_limit_makes_an_incomplete_response(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.script.finish_reason = pb.FINISH_REASON_LENGTH
    response = await create(http, input="Write a lot.", max_output_tokens=3)
    body = response.json()
    assert_valid(body, "ResponseResource")
    assert body["status"] == "incomplete"
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    assert body["output"][0]["status"] == "incomplete"
    assert engine.requests[0].sampling.max_tokens == 3


async def test_tool_call_becomes_a_function_call_item(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    engine.script.text_chunks = ["\n"]
    engine.script.tool_calls = [pb.ToolCall(id="call_7", name="screenshot", arguments="{}")]
    engine.script.finish_reason = pb.FINISH_REASON_TOOL_CALLS
    response = await create(http, input="Take a screenshot.", tools=[SCREENSHOT_TOOL])
    body = response.json()
    assert_valid(body, "ResponseResource")
    # A turn that only calls a tool has no message item (the newline before the call is not one).
    (call,) = body["output"]
    assert call["type"] == "function_call" and ID_PATTERN.match(call["id"])
    assert (call["call_id"], call["name"], call["arguments"], call["status"]) == (
        "call_7",
        "screenshot",
        "{}",
        "completed",
    )
    assert [tool.function.name for tool in engine.requests[0].tools] == ["screenshot"]


async def test_a_screenshot_tool_image_reaches_the_engine_as_a_follow_up_user_turn(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    image = png_bytes((255, 0, 0))
    response = await create(
        http, input=screenshot_tool_input(png_data_url((255, 0, 0))), tools=[SCREENSHOT_TOOL]
    )
    assert response.status_code == 200, response.text
    messages = lower_messages(engine.requests[0].messages)  # as the engine renders them
    roles = [message.role for message in messages]
    assert roles == [pb.ROLE_USER, pb.ROLE_ASSISTANT, pb.ROLE_TOOL, pb.ROLE_USER]
    tool, follow_up = messages[2], messages[3]
    assert tool.tool_output.text == f"captured\n{IMAGE_FOLLOW_UP_MARKER}"
    assert [part.WhichOneof("kind") for part in follow_up.parts] == ["image"]
    assert follow_up.parts[0].image.data == image
    assert sum(part.WhichOneof("kind") == "image" for m in messages for part in m.parts) == 1


async def test_input_image_and_chat_image_url_make_the_same_engine_request(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    url = png_data_url((0, 0, 255))
    native = [{"type": "input_text", "text": "What colour?"}, {"type": "input_image", "image_url": url}]
    chat = [{"type": "text", "text": "What colour?"}, {"type": "image_url", "image_url": {"url": url}}]
    for content in (native, chat):
        response = await create(http, input=[{"role": "user", "content": content}])
        assert response.status_code == 200, response.text
    first, second = engine.requests
    assert list(first.messages) == list(second.messages)
    assert first.messages[0].parts[1].image.detail == pb.IMAGE_DETAIL_AUTO


async def test_hosted_tools_are_left_out_and_named_in_a_header(
    http: httpx.AsyncClient, engine: FakeEngine, caplog: pytest.LogCaptureFixture
) -> None:
    tools = [SCREENSHOT_TOOL, {"type": "web_search", "external_web_access": False}]
    with caplog.at_level("INFO", logger="vlmserve.facade"):
        response = await create(http, input="hi", tools=tools)
    assert response.status_code == 200
    assert response.headers["x-vlmserve-ignored-tools"] == "web_search"
    assert [tool.function.name for tool in engine.requests[0].tools] == ["screenshot"]
    assert any("web_search" in record.getMessage() for record in caplog.records)


# Tool types that are not ours to echo: non-Latin-1 (a header cannot carry them: was a 500) and
# CR/LF/NUL (header injection: uvicorn dropped the connection while the generation ran on).
HOSTILE_TOOL_TYPES = ["wéb_séarch_ツール", "web_search\r\nx-injected: 1", "web\x00search", "web_search\n"]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("tool_type", HOSTILE_TOOL_TYPES, ids=["non-latin-1", "crlf", "nul", "lf"])
async def test_an_unknown_tool_type_is_a_400_and_never_reaches_a_header(
    server_url: str, engine: FakeEngine, tool_type: str, stream: bool
) -> None:
    tools = [{"type": "web_search"}, {"type": tool_type}]
    async with httpx.AsyncClient(base_url=server_url) as client:
        body = {"model": "default", "input": "hi", "stream": stream, "tools": tools}
        response = await client.post("/v1/responses", json=body)
        assert response.status_code == 400, response.text[:300]
        error = response.json()["error"]
        assert (error["param"], error["code"]) == ("tools[1].type", "unsupported_value")
        assert tool_type not in error["message"]
        assert not any(tool_type in value for value in response.headers.values())
        # Nothing ran and nothing was stored under an id the client never saw.
        assert engine.requests == []


async def test_only_known_hosted_tool_names_go_in_the_header(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    tools = [
        {"type": "namespace", "name": "ns\r\nx-evil: 1", "tools": [{"type": "function", "name": "f"}]},
        {"type": "code_interpreter", "container": {"type": "auto"}},
        {"type": "web_search_preview"},
    ]
    response = await create(http, input="hi", tools=tools)
    assert response.status_code == 200, response.text
    assert response.headers["x-vlmserve-ignored-tools"] == "code_interpreter,web_search_preview"


async def test_codex_request_fields_are_accepted(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    image = png_data_url((0, 255, 0))
    body = {
        "model": "default",
        "store": False,
        "tool_choice": "auto",
        "parallel_tool_calls": True,
        "reasoning": {"summary": "auto"},
        "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "01a22a73-c53f-70d3-8d38-efad557a712c",
        "client_metadata": {"x-codex-installation-id": "abc", "turn_id": "t1"},
        "text": {"verbosity": "low"},
        "input": [
            {
                "type": "message",
                "id": "msg_1",
                "role": "developer",
                "content": [{"type": "input_text", "text": "rules"}],
            },
            {
                "type": "message",
                "id": "msg_2",
                "role": "user",
                "content": [{"type": "input_text", "text": "look"}],
            },
            {
                "type": "function_call",
                "id": "fc_1",
                "status": "completed",
                "name": "view_image",
                "arguments": '{"path": "a.png"}',
                "call_id": "call_1",
            },
            {
                "type": "function_call_output",
                "id": "fco_1",
                "call_id": "call_1",
                "output": [{"type": "input_image", "image_url": image, "detail": "high"}],
            },
        ],
        "tools": [
            {"type": "function", "name": "view_image", "strict": False, "parameters": {"type": "object"}},
            {
                "type": "namespace",
                "name": "multi_agent_v1",
                "description": "agents",
                "tools": [{"type": "function", "name": "close_agent", "parameters": {"type": "object"}}],
            },
            {"type": "web_search", "external_web_access": False},
        ],
    }
    headers = {"x-codex-turn-metadata": '{"turn_id": "t1"}', "x-codex-window-id": "w:0"}
    response = await http.post("/v1/responses", json=body, headers=headers)
    assert response.status_code == 200, response.text
    assert_valid(response.json(), "ResponseResource")
    assert response.headers["x-vlmserve-ignored-tools"] == "web_search"
    request = engine.requests[0]
    lowered = lower_messages(request.messages)  # as the engine renders them
    assert sorted(tool.function.name for tool in request.tools) == ["close_agent", "view_image"]
    images = [part.image for m in lowered for part in m.parts if part.WhichOneof("kind") == "image"]
    assert len(images) == 1 and images[0].detail == pb.IMAGE_DETAIL_HIGH
    assert lowered[-1].role == pb.ROLE_USER


@pytest.mark.parametrize(
    ("default", "cap", "requested", "sent"),
    [
        (1024, None, None, 1024),
        (1024, None, 5000, 5000),
        (None, None, None, None),
        (1024, 100, None, 100),
        (8, 100, None, 8),
        (1024, 100, 50, 50),
    ],
)
async def test_output_token_default_and_cap(
    settings: FacadeSettings,
    engine_client: AsyncEngineClient,
    store: Store,
    engine: FakeEngine,
    default: int | None,
    cap: int | None,
    requested: int | None,
    sent: int | None,
) -> None:
    limits = Limits(default_max_output_tokens=default, max_output_tokens=cap)
    app = create_app(settings.replace(limits=limits), engine=engine_client, store=store)
    async with in_process(app) as http:
        body: dict[str, Any] = {"input": "hi"}
        if requested is not None:
            body["max_output_tokens"] = requested
        response = await http.post("/v1/responses", json=body)
    assert response.status_code == 200
    sampling = engine.requests[0].sampling
    assert (sampling.max_tokens if sampling.HasField("max_tokens") else None) == sent
    # The echo is what the client asked for.
    assert response.json()["max_output_tokens"] == requested


async def test_max_output_tokens_above_the_cap_is_400(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    app = create_app(
        settings.replace(limits=Limits(max_output_tokens=100)), engine=engine_client, store=store
    )
    async with in_process(app) as http:
        response = await http.post("/v1/responses", json={"input": "hi", "max_output_tokens": 101})
    assert response.status_code == 400 and response.json()["error"]["param"] == "max_output_tokens"
