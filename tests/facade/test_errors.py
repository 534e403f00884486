"""Every failure is an OpenAI-shaped error with the right status and `param`; never a 500."""

from __future__ import annotations

import base64
from typing import Any

import grpc
import httpx
import pytest

from tests.facade.fake_engine import CONTEXT_LENGTH, FakeEngine

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
    [("limit=0", "limit"), ("limit=101", "limit"), ("limit=abc", "limit"), ("order=sideways", "order")],
)
async def test_query_validation_errors_are_400_with_param(
    http: httpx.AsyncClient, query: str, param: str
) -> None:
    created = await http.post("/v1/responses", json={"model": "default", "input": "hi"})
    response = await http.get(f"/v1/responses/{created.json()['id']}/input_items?{query}")
    assert_error(response, 400, param)


ENGINE_ERRORS = [
    (grpc.StatusCode.INVALID_ARGUMENT, 400, None),
    (grpc.StatusCode.NOT_FOUND, 404, None),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, 503, None),
    (grpc.StatusCode.UNAVAILABLE, 503, None),
    (grpc.StatusCode.DEADLINE_EXCEEDED, 504, None),
    (grpc.StatusCode.OUT_OF_RANGE, 400, "input"),
    (grpc.StatusCode.INTERNAL, 502, None),
]


@pytest.mark.parametrize(
    ("code", "status", "param"), ENGINE_ERRORS, ids=[c.name for c, _, _ in ENGINE_ERRORS]
)
@pytest.mark.parametrize("stream", [False, True])
async def test_engine_errors_map_to_http_statuses(
    http: httpx.AsyncClient,
    engine: FakeEngine,
    code: grpc.StatusCode,
    status: int,
    param: str | None,
    stream: bool,
) -> None:
    engine.script.error = (code, "engine says no")
    response = await http.post("/v1/responses", json={"model": "default", "input": "hi", "stream": stream})
    error = assert_error(response, status, param)
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        assert response.headers["retry-after"] == "1"
    if code == grpc.StatusCode.OUT_OF_RANGE:
        assert str(CONTEXT_LENGTH) in error["message"] and error["code"] == "context_length_exceeded"
    if code == grpc.StatusCode.INTERNAL:
        # Unexpected engine failures are not echoed.
        assert "engine says no" not in error["message"]


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
