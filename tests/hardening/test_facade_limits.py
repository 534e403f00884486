"""The facade's limits: each a setting with a safe default, each an OpenAI-shaped 4xx."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from starlette.types import Message

from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import MakeClient, png_data_url, serving
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Limits, Store, create_app
from vlmserve.facade.cli import server_config, settings_from_args
from vlmserve.facade.http.request_body import MAX_JSON_DEPTH


def error_of(reply: httpx.Response, status: int = 400) -> dict[str, Any]:
    assert reply.status_code == status, reply.text
    error: dict[str, Any] = reply.json()["error"]
    assert error["type"] == "invalid_request_error"
    return error


def images(count: int, size: tuple[int, int] = (8, 8)) -> dict[str, Any]:
    content = [{"type": "input_image", "image_url": png_data_url(size=size)} for _ in range(count)]
    return {"input": [{"role": "user", "content": content}]}


def test_defaults_are_bounded() -> None:
    limits = FacadeSettings.from_env({}).limits
    assert limits.max_request_bytes == 64 * 1024 * 1024
    assert limits.max_output_tokens == 32768
    assert limits.max_images_per_request == 16
    assert (limits.max_image_bytes, limits.max_image_pixels) == (20 * 1024 * 1024, 50_000_000)
    assert (limits.max_tools, limits.max_tool_bytes) == (128, 64 * 1024)
    assert (limits.max_headers, limits.max_header_bytes) == (100, 32 * 1024)
    env = FacadeSettings.from_env(
        {"VLMSERVE_FACADE_MAX_IMAGES_PER_REQUEST": "4", "VLMSERVE_FACADE_MAX_TOOLS": "9"}
    )
    assert (env.limits.max_images_per_request, env.limits.max_tools) == (4, 9)
    flags = settings_from_args(
        ["--max-images", "3", "--max-request-bytes", "1000", "--shutdown-grace", "7"], {}
    )
    assert (flags.limits.max_images_per_request, flags.limits.max_request_bytes) == (3, 1000)
    assert flags.shutdown_grace_s == 7.0
    with pytest.raises(ValueError):
        Limits(max_tools=0)


# --- body size: 413, enforced while the body is read ------------------------------------------


async def test_oversize_body_is_refused_while_it_is_read(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    """A chunked body with no Content-Length: the app stops reading just past the limit."""
    app = create_app(
        settings.replace(limits=Limits(max_request_bytes=10_000)),
        engine=engine_client,
        store=store,
    )
    chunk = b" " * 1000
    received = 0
    sent: list[Message] = []

    async def receive() -> Message:
        nonlocal received
        received += 1
        if received > 1000:  # the body would go on for 1 MB
            return {"type": "http.disconnect"}
        return {"type": "http.request", "body": chunk, "more_body": True}

    async def send(message: Message) -> None:
        sent.append(message)

    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": "/v1/responses",
        "raw_path": b"/v1/responses",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"t"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 1),
        "server": ("t", 80),
    }
    await app(scope, receive, send)
    assert sent[0]["status"] == 413
    assert json.loads(sent[1]["body"])["error"]["code"] == "request_too_large"
    assert received <= 11


async def test_declared_oversize_body_is_refused_before_reading(
    client_for: MakeClient,
) -> None:
    http = client_for(max_request_bytes=100)
    error = error_of(await http.post("/v1/responses", json={"input": "x" * 200}), 413)
    assert error["code"] == "request_too_large"


# --- images -------------------------------------------------------------------------------------


async def test_images_per_request_are_counted_with_replayed_turns(
    client_for: MakeClient, engine: FakeEngine
) -> None:
    http = client_for(max_images_per_request=2)
    error = error_of(await http.post("/v1/responses", json=images(3)))
    assert (error["param"], error["code"]) == ("input", "too_many_images")
    assert engine.requests == []
    first = await http.post("/v1/responses", json=images(2))
    assert first.status_code == 200, first.text
    follow_up = images(1) | {"previous_response_id": first.json()["id"]}
    assert error_of(await http.post("/v1/responses", json=follow_up))["param"] == "input"
    assert len(engine.requests) == 1
    conversation_items = {"items": images(3)["input"]}
    assert error_of(await http.post("/v1/conversations", json=conversation_items))["param"] == "items"


async def test_image_bytes_and_pixels_are_bounded_by_settings(
    client_for: MakeClient,
) -> None:
    http = client_for(max_image_pixels=100)
    error = error_of(await http.post("/v1/responses", json=images(1, size=(11, 10))))
    assert (error["param"], error["code"]) == ("input[0].content[0].image_url", "image_too_large")
    assert (await http.post("/v1/responses", json=images(1, size=(10, 10)))).status_code == 200
    http = client_for(max_image_bytes=50)
    error = error_of(await http.post("/v1/responses", json=images(1)))
    assert (error["param"], error["code"]) == ("input[0].content[0].image_url", "image_too_large")


# --- max_output_tokens ----------------------------------------------------------------------------


@pytest.mark.parametrize("value", [32769, 2**31, 2**40])
async def test_max_output_tokens_over_the_cap_is_a_named_400(client_for: MakeClient, value: int) -> None:
    error = error_of(
        await client_for().post("/v1/responses", json={"input": "x", "max_output_tokens": value})
    )
    assert error["param"] == "max_output_tokens"


async def test_max_output_tokens_at_the_cap_is_sent(client_for: MakeClient, engine: FakeEngine) -> None:
    reply = await client_for().post("/v1/responses", json={"input": "x", "max_output_tokens": 32768})
    assert reply.status_code == 200
    assert engine.requests[0].sampling.max_tokens == 32768


# --- tools ----------------------------------------------------------------------------------------


def function_tool(name: str, **extra: Any) -> dict[str, Any]:
    return {"type": "function", "name": name, "parameters": {"type": "object", "properties": {}}} | extra


async def test_tool_count_is_bounded_namespaces_included(
    client_for: MakeClient,
) -> None:
    http = client_for(max_tools=2)
    ok = await http.post(
        "/v1/responses", json={"input": "x", "tools": [function_tool("a"), function_tool("b")]}
    )
    assert ok.status_code == 200, ok.text
    three = [function_tool("a"), function_tool("b"), function_tool("c")]
    error = error_of(await http.post("/v1/responses", json={"input": "x", "tools": three}))
    assert (error["param"], error["code"]) == ("tools", "array_above_max_length")
    namespace = {"type": "namespace", "name": "ns", "description": "d", "tools": three}
    assert (
        error_of(await http.post("/v1/responses", json={"input": "x", "tools": [namespace]}))["param"]
        == "tools"
    )


async def test_tool_size_is_bounded(client_for: MakeClient) -> None:
    http = client_for(max_tool_bytes=2000)
    big = function_tool("big", description="d" * 3000)
    error = error_of(
        await http.post("/v1/responses", json={"input": "x", "tools": [function_tool("a"), big]})
    )
    assert error["param"] == "tools[1]"
    tokens = await http.post("/v1/responses/input_tokens", json={"input": "x", "tools": [big]})
    assert error_of(tokens)["param"] == "tools[0]"


# --- JSON shape: depth and lone surrogates ----------------------------------------------------


async def test_deeply_nested_json_is_a_named_400(client_for: MakeClient) -> None:
    nested: Any = {}
    for _ in range(MAX_JSON_DEPTH + 5):
        nested = {"a": nested}
    tool = function_tool("deep", parameters=nested)
    error = error_of(await client_for().post("/v1/responses", json={"input": "x", "tools": [tool]}))
    assert error["code"] == "invalid_json"
    assert error["param"].startswith("tools[0].parameters.a.a")
    raw = "[" * 5000 + "]" * 5000
    error = error_of(await client_for().post("/v1/responses", content=raw))
    assert error["code"] == "invalid_json"


@pytest.mark.parametrize(
    ("raw", "param"),
    [
        ('{"input": "\\ud800"}', "input"),
        ('{"input": "x", "instructions": "a\\udfffb"}', "instructions"),
        ('{"input": "x", "metadata": {"k": "\\udc00"}}', "metadata.k"),
        (
            '{"input": [{"role": "user", "content": [{"type": "input_text", "text": "\\ud83d"}]}]}',
            "input[0].content[0].text",
        ),
    ],
)
async def test_unpaired_surrogates_are_a_named_400(client_for: MakeClient, raw: str, param: str) -> None:
    error = error_of(await client_for().post("/v1/responses", content=raw))
    assert (error["param"], error["code"]) == (param, "invalid_value")


async def test_paired_surrogates_and_raw_utf8_are_fine(client_for: MakeClient, engine: FakeEngine) -> None:
    raw = '{"input": "\\ud83d\\ude00 and 😀 and \\u00e9"}'
    assert (await client_for().post("/v1/responses", content=raw)).status_code == 200
    assert engine.requests[0].messages[-1].parts[0].text.text == "😀 and 😀 and é"


async def test_encoded_surrogates_and_non_utf8_bodies_are_not_json(
    client_for: MakeClient,
) -> None:
    for raw in (b'{"input": "\xed\xa0\x80"}', '{"input": "x"}'.encode("utf-16")):
        assert error_of(await client_for().post("/v1/responses", content=raw))["code"] == "invalid_json"


# --- headers: 431 ---------------------------------------------------------------------------------


async def test_too_many_headers_is_a_431(client_for: MakeClient) -> None:
    http = client_for(max_headers=20)
    headers = [(f"x-h{index}", "v") for index in range(25)]
    error = error_of(await http.get("/healthz", headers=headers), 431)
    assert error["code"] == "request_header_fields_too_large"
    assert (await http.get("/healthz", headers=headers[:10])).status_code == 200


async def test_oversize_headers_are_a_431(client_for: MakeClient) -> None:
    http = client_for(max_header_bytes=1000)
    assert error_of(await http.get("/healthz", headers={"x-big": "v" * 1200}), 431)["param"] is None


async def test_the_server_bounds_what_it_buffers_for_headers(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    """Through uvicorn as the CLI configures it: a header block far over the limit is refused by
    the HTTP parser itself (it never reaches the app), a moderate one by the app's 431."""
    limited = settings.replace(host="127.0.0.1", port=0, limits=Limits(max_header_bytes=4096))
    app: FastAPI = create_app(limited, engine=engine_client, store=store)
    config = server_config(app, limited)
    config.lifespan = "off"
    config.log_level = "warning"
    async with serving(config, stop_timeout_s=10) as port:
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http:
            assert (await http.get("/healthz")).status_code == 200
            assert (await http.get("/healthz", headers={"x-big": "v" * 6000})).status_code == 431
        status = await asyncio.to_thread(_raw_request_status, port, b"x-huge: " + b"v" * 64_000)
        assert status in (400, 431)


def _raw_request_status(port: int, header: bytes) -> int:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"GET /healthz HTTP/1.1\r\nHost: t\r\n" + header + b"\r\n\r\n")
        reply = sock.recv(1024)
    return int(reply.split(b" ", 2)[1])
