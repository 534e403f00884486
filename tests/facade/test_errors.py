"""Every failure is an OpenAI-shaped error with the right status and `param`; never a 500."""

from __future__ import annotations

import base64
from typing import Any

import grpc
import httpx
import pytest

from tests.facade.fake_engine import CONTEXT_LENGTH, FakeEngine
from vlmserve.engine.request_errors import RequestError

IMAGE_PART_PATH = "input[0].content[0].image_url"


def assert_error(response: httpx.Response, status: int, param: str | None) -> dict[str, Any]:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["param"] == param
    assert error["type"] == ("invalid_request_error" if status < 500 else "server_error")
    assert isinstance(error["message"], str) and error["message"]
    return dict(error)


def image_input(url: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"type": "input_image", "image_url": url}]}]


BAD_PAYLOAD = base64.b64encode(b"this is plain text, not an image at all").decode()

BAD_REQUESTS = [
    pytest.param({"model": "default", "input": []}, "input", id="empty-input"),
    pytest.param({"model": "default", "input": "   "}, "input", id="blank-input"),
    pytest.param({"model": "default"}, "input", id="missing-input"),
    pytest.param(
        {"model": "default", "input": [{"type": "nonsense"}]}, "input[0].type", id="unknown-item-type"
    ),
    pytest.param(
        {"model": "default", "input": image_input("data:image/png;base64,@@@@")},
        IMAGE_PART_PATH,
        id="bad-b64",
    ),
    pytest.param(
        {"model": "default", "input": image_input(f"data:image/png;base64,{BAD_PAYLOAD}")},
        IMAGE_PART_PATH,
        id="not-an-image",
    ),
    pytest.param(
        {"model": "default", "input": image_input("file:///etc/passwd")}, IMAGE_PART_PATH, id="file-url"
    ),
    pytest.param({"model": "default", "input": image_input("/etc/passwd")}, IMAGE_PART_PATH, id="bare-path"),
    pytest.param(
        {"model": "default", "input": image_input("https://example.com/cat.png")},
        IMAGE_PART_PATH,
        id="remote-url",
    ),
    pytest.param(
        {
            "model": "default",
            "input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file_1"}]}],
        },
        "input[0].content[0].file_id",
        id="file-id-only",
    ),
    pytest.param({"model": "default", "input": "hi", "temperature": "hot"}, "temperature", id="wrong-type"),
    pytest.param({"model": 7, "input": "hi"}, "model", id="model-not-a-string"),
]


@pytest.mark.parametrize(("body", "param"), BAD_REQUESTS)
@pytest.mark.parametrize("stream", [False, True])
async def test_bad_requests_are_400_with_param(
    http: httpx.AsyncClient, engine: FakeEngine, body: dict[str, Any], param: str, stream: bool
) -> None:
    response = await http.post("/v1/responses", json={**body, "stream": stream})
    error = assert_error(response, 400, param)
    assert BAD_PAYLOAD not in response.text
    assert "Traceback" not in error["message"]
    assert engine.requests == []


@pytest.mark.parametrize(
    "content",
    [b"{not json", b'{"input": "hi",}', b"\xff\xfe", b"", b'{"input": NaN}', b"[" * 100_000],
    ids=["truncated", "trailing-comma", "not-utf8", "empty", "nan", "too-deep"],
)
async def test_malformed_json_is_400_with_null_param(http: httpx.AsyncClient, content: bytes) -> None:
    response = await http.post("/v1/responses", content=content, headers={"content-type": "application/json"})
    assert_error(response, 400, None)


@pytest.mark.parametrize("body", [b"[]", b'"text"', b"42", b"null"])
async def test_body_that_is_not_an_object_is_400(http: httpx.AsyncClient, body: bytes) -> None:
    response = await http.post("/v1/responses", content=body, headers={"content-type": "application/json"})
    assert_error(response, 400, None)


async def test_oversized_body_is_413(http: httpx.AsyncClient, app: Any) -> None:
    limit = app.state.facade.settings.limits.max_request_bytes
    response = await http.post("/v1/responses", content=b" " * (limit + 1))
    assert_error(response, 413, None)


async def test_unknown_route_and_wrong_method_are_openai_shaped(http: httpx.AsyncClient) -> None:
    assert_error(await http.get("/v1/nothing-here"), 404, None)
    assert_error(await http.put("/v1/responses"), 405, None)


@pytest.mark.parametrize(
    ("query", "param"),
    [
        ("limit=0", "limit"),
        ("limit=101", "limit"),
        ("limit=abc", "limit"),
        ("order=sideways", "order"),
        ("include[]=message.input_image.image_url&include[]=everything", "include[1]"),
    ],
)
async def test_query_validation_errors_are_400_with_param(
    http: httpx.AsyncClient, query: str, param: str
) -> None:
    created = await http.post("/v1/responses", json={"model": "default", "input": "hi"})
    response = await http.get(f"/v1/responses/{created.json()['id']}/input_items?{query}")
    assert_error(response, 400, param)


# What the real engine sends (a RequestError's status, structured details included).
ENGINE_ERRORS = [
    (
        RequestError(grpc.StatusCode.INVALID_ARGUMENT, "engine says no", field="messages[1].parts[0]"),
        400,
        "input",
    ),
    (RequestError(grpc.StatusCode.INVALID_ARGUMENT, "engine says no", field="sampling.top_p"), 400, "top_p"),
    (
        RequestError(grpc.StatusCode.INVALID_ARGUMENT, "engine says no", field="tools[0].function"),
        400,
        "tools",
    ),
    (RequestError(grpc.StatusCode.INVALID_ARGUMENT, "engine says no", field="request_id"), 400, None),
    (
        RequestError(
            grpc.StatusCode.INVALID_ARGUMENT,
            "engine says no",
            field="response_format.json_schema.schema_json",
        ),
        400,
        "text.format.schema",
    ),
    (RequestError(grpc.StatusCode.NOT_FOUND, "engine says no", field="model"), 404, "model"),
    (RequestError(grpc.StatusCode.RESOURCE_EXHAUSTED, "engine says no", retry_after_s=1.0), 503, None),
    (RequestError(grpc.StatusCode.UNAVAILABLE, "engine says no"), 503, None),
    (RequestError(grpc.StatusCode.UNAVAILABLE, "still loading", retry_after_s=2.5), 503, None),
    (RequestError(grpc.StatusCode.DEADLINE_EXCEEDED, "engine says no"), 504, None),
    (RequestError(grpc.StatusCode.OUT_OF_RANGE, "engine says no", field="messages"), 400, "input"),
    (RequestError(grpc.StatusCode.INTERNAL, "engine says no"), 502, None),
]


@pytest.mark.parametrize(
    ("engine_error", "status", "param"),
    ENGINE_ERRORS,
    ids=[f"{e.code.name}-{e.field}" for e, _, _ in ENGINE_ERRORS],
)
@pytest.mark.parametrize("stream", [False, True])
async def test_engine_errors_map_to_http_statuses(
    http: httpx.AsyncClient,
    engine: FakeEngine,
    engine_error: RequestError,
    status: int,
    param: str | None,
    stream: bool,
) -> None:
    engine.script.error = engine_error
    response = await http.post("/v1/responses", json={"model": "default", "input": "hi", "stream": stream})
    error = assert_error(response, status, param)
    code = engine_error.code
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        assert response.headers["retry-after"] == "1"
    if code == grpc.StatusCode.UNAVAILABLE:
        # Only an engine that says when (RetryInfo, while its model loads) gets a Retry-After.
        assert response.headers.get("retry-after") == ("3" if engine_error.retry_after_s else None)
    if code == grpc.StatusCode.OUT_OF_RANGE:
        assert str(CONTEXT_LENGTH) in error["message"] and error["code"] == "context_length_exceeded"
    if code == grpc.StatusCode.INTERNAL:
        # Unexpected engine failures are not echoed.
        assert "engine says no" not in error["message"]


async def test_an_engine_field_path_becomes_param_whatever_the_text_says(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    """`param` comes from the structured field violation; the message text plays no part."""
    engine.script.error = RequestError(
        grpc.StatusCode.INVALID_ARGUMENT,
        "tools[0] is wrong (see sampling.top_p)",
        field="sampling.temperature",
    )
    response = await http.post("/v1/responses", json={"model": "default", "input": "hi"})
    assert assert_error(response, 400, "temperature")["message"] == "tools[0] is wrong (see sampling.top_p)"
    # A bare INVALID_ARGUMENT (no details) names no param rather than guessing one from its text.
    engine.script.error = (grpc.StatusCode.INVALID_ARGUMENT, "messages[0].parts[0]: bad image")
    response = await http.post("/v1/responses", json={"model": "default", "input": "hi"})
    assert_error(response, 400, None)


async def test_engine_down_is_503(http: httpx.AsyncClient, fake_engine: Any) -> None:
    await fake_engine.stop()
    response = await http.post("/v1/responses", json={"model": "default", "input": "hi"})
    assert_error(response, 503, None)
    assert_error(await http.get("/v1/models"), 503, None)


async def test_image_error_never_echoes_base64(http: httpx.AsyncClient) -> None:
    # A PNG signature followed by garbage: sniffed as PNG, refused when its header is read.
    payload = base64.b64encode(b"\x89PNG\r\n\x1a\n" + b"garbage-bytes-" * 20).decode()
    url = f"data:image/png;base64,{payload}"
    response = await http.post("/v1/responses", json={"model": "default", "input": image_input(url)})
    assert_error(response, 400, IMAGE_PART_PATH)
    assert payload[:24] not in response.text
