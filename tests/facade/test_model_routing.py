"""Two models behind one facade, each its own scripted engine: `model` picks the pool (by id or
alias, or the model a continued response used), unknown ids are a 404 naming what is served,
`/v1/models` lists both, each model's own limits apply, and a response continues on the other
model with its history."""

from __future__ import annotations

import base64
import contextlib
import io
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from tests._pdfs import text_pdf
from tests.facade.fake_engine import FakeEngine, RunningFakeEngine, start_fake_engine
from tests.facade.helpers import in_process, png_data_url
from vlmserve.client import AsyncEngineClient
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade import FacadeSettings, Store, create_app


@dataclass
class Two:
    http: httpx.AsyncClient
    a: FakeEngine
    b: FakeEngine


@pytest.fixture
async def two(tmp_path: Path, settings: FacadeSettings, store: Store) -> AsyncIterator[Two]:
    async with two_models(tmp_path, settings, store, "max_output_tokens = 100") as running:
        yield running


@contextlib.asynccontextmanager
async def two_models(
    tmp_path: Path, settings: FacadeSettings, store: Store, b_limits: str
) -> AsyncIterator[Two]:
    """Models a (the default) and b ("small", with `b_limits` in its models file entry)."""
    engines: list[RunningFakeEngine] = [await start_fake_engine(), await start_fake_engine()]
    a, b = (running.servicer for running in engines)
    a.info.model_id = "engine-a"
    b.info.model_id = "engine-b"
    b.info.context_length = 2048
    b.info.thinking = True
    b.info.image_limits.max_images_per_request = 1
    b.info.weights = pb.WEIGHTS_STATE_UNLOADED
    models_file = tmp_path / "models.toml"
    models_file.write_text(
        f"""
[[models]]
id = "b"
engines = ["{engines[1].address}"]
aliases = ["small"]
limits = {{ {b_limits} }}
""",
        encoding="utf-8",
    )
    two_models = settings.replace(
        engine=(f"a={engines[0].address}",), model_alias=("default=a",), models_file=models_file
    )
    clients = {"a": AsyncEngineClient(engines[0].address), "b": AsyncEngineClient(engines[1].address)}
    app = create_app(two_models, engine=clients, store=store)
    async with in_process(app) as http:
        yield Two(http, a, b)
    for client in clients.values():
        await client.close()
    for running in engines:
        await running.stop()


async def create(http: httpx.AsyncClient, **body: Any) -> dict[str, Any]:
    response = await http.post("/v1/responses", json={"input": "hi", **body})
    assert response.status_code == 200, response.text
    created: dict[str, Any] = response.json()
    return created


@pytest.mark.parametrize(
    ("name", "pool"), [("a", "a"), ("default", "a"), (None, "a"), ("b", "b"), ("small", "b")]
)
async def test_model_picks_the_pool(two: Two, name: str | None, pool: str) -> None:
    created = await create(two.http, **({"model": name} if name is not None else {}))
    assert created["model"] == pool
    engine, other = (two.a, two.b) if pool == "a" else (two.b, two.a)
    (request,) = engine.requests
    assert request.model == f"engine-{pool}" and other.requests == []


async def test_chat_completions_and_token_counts_are_routed(two: Two) -> None:
    chat = await two.http.post(
        "/v1/chat/completions", json={"model": "small", "messages": [{"role": "user", "content": "hi"}]}
    )
    assert chat.status_code == 200 and chat.json()["model"] == "b"
    counted = await two.http.post("/v1/responses/input_tokens", json={"model": "b", "input": "hi"})
    assert counted.status_code == 200
    assert len(two.b.requests) == 1 and len(two.b.count_requests) == 1 and two.a.count_requests == []


@pytest.mark.parametrize("path", ["/v1/responses", "/v1/chat/completions", "/v1/responses/input_tokens"])
async def test_unknown_model_is_a_404_naming_it(two: Two, path: str) -> None:
    body = {"model": "gpt-5", "input": "hi", "messages": [{"role": "user", "content": "hi"}]}
    if path != "/v1/chat/completions":
        del body["messages"]
    response = await two.http.post(path, json=body)
    assert response.status_code == 404, response.text
    error = response.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model"
    assert '"gpt-5"' in error["message"]
    assert all(f'"{name}"' in error["message"] for name in ("a", "default", "b", "small"))
    assert two.a.requests == two.b.requests == []


async def test_models_listed_with_their_engines_info(two: Two) -> None:
    listed = (await two.http.get("/v1/models")).json()["data"]
    assert [model["id"] for model in listed] == ["a", "b"]
    a, b = (model["vlmserve"] for model in listed)
    assert a["aliases"] == ["default"] and b["aliases"] == ["small"]
    assert (a["engine_model"], b["engine_model"]) == ("engine-a", "engine-b")
    assert (a["context_length"], b["context_length"]) == (4096, 2048)
    assert (a["thinking"], b["thinking"]) == (False, True)
    assert (a["weights"], b["weights"]) == ("unspecified", "unloaded")
    assert b["tool_call_format"] == "hermes" and b["input_modalities"] == ["text", "image"]
    small = await two.http.get("/v1/models/small")
    assert small.status_code == 200 and small.json()["id"] == "b"
    assert (await two.http.get("/v1/models/engine-a")).status_code == 404


async def test_each_model_its_own_limits(two: Two) -> None:
    two_images = [
        {
            "role": "user",
            "content": [
                {"type": "input_image", "image_url": png_data_url()},
                {"type": "input_image", "image_url": png_data_url((0, 255, 0))},
            ],
        }
    ]
    assert (await two.http.post("/v1/responses", json={"model": "a", "input": two_images})).status_code == 200
    refused = await two.http.post("/v1/responses", json={"model": "b", "input": two_images})
    assert refused.status_code == 400 and "1" in refused.json()["error"]["message"], refused.text
    # b's own max_output_tokens (models file), not the facade's.
    assert (
        await two.http.post("/v1/responses", json={"model": "a", "input": "hi", "max_output_tokens": 500})
    ).status_code == 200
    too_many = await two.http.post(
        "/v1/responses", json={"model": "b", "input": "hi", "max_output_tokens": 500}
    )
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "max_output_tokens"
    # Requests without max_output_tokens get at most b's cap.
    await create(two.http, model="b")
    assert two.b.requests[-1].sampling.max_tokens == 100


async def test_a_response_continues_on_the_other_model(two: Two) -> None:
    first = await create(two.http, model="a", input="remember the red square")
    follow = await create(two.http, model="b", input="what was it?", previous_response_id=first["id"])
    assert follow["model"] == "b"
    (request,) = two.b.requests
    # a's turn (its input and output) is in b's request, as contract messages b's engine renders.
    texts = [part.text.text for message in request.messages for part in message.parts]
    assert texts[:2] == ["remember the red square", "Hello, world."] and texts[-1] == "what was it?"
    # Without `model`, a continuation stays on the model of the response it continues.
    again = await create(two.http, input="and then?", previous_response_id=follow["id"])
    assert again["model"] == "b" and len(two.b.requests) == 2
    assert (await two.http.get(f"/v1/responses/{first['id']}")).json()["model"] == "a"


async def test_a_conversation_remembers_its_model(two: Two) -> None:
    created = await two.http.post("/v1/conversations", json={"model": "small"})
    assert created.status_code == 200, created.text
    conversation = created.json()
    # The alias resolved to the model's id, shown on the conversation (an extension).
    assert conversation["model"] == "b"
    first = await create(two.http, input="remember the red square", conversation=conversation["id"])
    assert first["model"] == "b" and len(two.b.requests) == 1 and not two.a.requests
    # Another model continues it: the history is in a's request, as contract messages a renders.
    other = await create(two.http, model="a", input="what was it?", conversation=conversation["id"])
    (request,) = two.a.requests
    texts = [part.text.text for message in request.messages for part in message.parts]
    assert texts[:2] == ["remember the red square", "Hello, world."] and texts[-1] == "what was it?"
    assert other["model"] == "a"
    shown = (await two.http.get(f"/v1/conversations/{conversation['id']}")).json()
    assert shown["model"] == "a"
    # Without `model`, the next turn stays on the model that answered last.
    again = await create(two.http, input="and then?", conversation=conversation["id"])
    assert again["model"] == "a" and len(two.a.requests) == 2 and len(two.b.requests) == 1


async def test_a_conversation_without_a_model_takes_its_first_responses(two: Two) -> None:
    conversation = (await two.http.post("/v1/conversations", json={})).json()
    assert "model" not in conversation
    await create(two.http, model="small", input="hi", conversation=conversation["id"])
    shown = (await two.http.get(f"/v1/conversations/{conversation['id']}")).json()
    assert shown["model"] == "b"
    await create(two.http, input="more", conversation=conversation["id"])
    assert len(two.b.requests) == 2 and not two.a.requests


async def test_a_conversation_of_an_unknown_model_is_refused(two: Two) -> None:
    refused = await two.http.post("/v1/conversations", json={"model": "nope"})
    assert refused.status_code == 404, refused.text
    error = refused.json()["error"]
    assert error["code"] == "model_not_found" and error["param"] == "model" and '"nope"' in error["message"]
    bad = await two.http.post("/v1/conversations", json={"model": 3})
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "model", bad.text


async def test_conversation_items_are_checked_against_its_models_limits(two: Two) -> None:
    two_images = [
        {
            "type": "message",
            "role": "user",
            "content": [
                {"type": "input_image", "image_url": png_data_url()},
                {"type": "input_image", "image_url": png_data_url((0, 255, 0))},
            ],
        }
    ]
    # b takes one image a request (its engine says so): at creation and when items are added.
    refused = await two.http.post("/v1/conversations", json={"model": "b", "items": two_images})
    assert refused.status_code == 400 and refused.json()["error"]["param"] == "items", refused.text
    on_b = (await two.http.post("/v1/conversations", json={"model": "b"})).json()
    added = await two.http.post(f"/v1/conversations/{on_b['id']}/items", json={"items": two_images})
    assert added.status_code == 400 and added.json()["error"]["param"] == "items", added.text
    on_a = await two.http.post("/v1/conversations", json={"model": "a", "items": two_images})
    assert on_a.status_code == 200, on_a.text


async def test_every_model_dependent_limit_can_be_set_per_model(
    tmp_path: Path, settings: FacadeSettings, store: Store
) -> None:
    b_limits = "max_tools = 1, max_tool_bytes = 4096, max_chain_depth = 1, max_pdf_pages = 1, pdf_dpi = 36.0"
    async with two_models(tmp_path, settings, store, b_limits) as two:
        tool = {"type": "function", "name": "f", "parameters": {"type": "object", "properties": {}}}
        tools = [tool, {**tool, "name": "g"}]
        assert (
            await two.http.post("/v1/responses", json={"model": "a", "input": "hi", "tools": tools})
        ).status_code == 200
        refused = await two.http.post("/v1/responses", json={"model": "b", "input": "hi", "tools": tools})
        assert refused.status_code == 400 and refused.json()["error"]["param"] == "tools", refused.text
        # b replays one response of a chain, a the whole of it.
        first = await create(two.http, model="a", input="one")
        second = await create(two.http, model="a", input="two", previous_response_id=first["id"])
        for model, engine in (("a", two.a), ("b", two.b)):
            await create(two.http, model=model, input="three", previous_response_id=second["id"])
            texts = [part.text.text for message in engine.requests[-1].messages for part in message.parts]
            expected = ["two", "Hello, world.", "three"]
            assert texts == (["one", "Hello, world.", *expected] if model == "a" else expected), texts
        # A PDF's pages are the model's images: b takes one page, at its own dpi.
        pdf = base64.b64encode(text_pdf(["page one", "page two"])).decode()
        document = [
            {
                "role": "user",
                "content": [
                    {
                        "type": "input_file",
                        "filename": "a.pdf",
                        "file_data": f"data:application/pdf;base64,{pdf}",
                    }
                ],
            }
        ]
        assert (
            await two.http.post("/v1/responses", json={"model": "a", "input": document})
        ).status_code == 200
        a_page = page_size(two.a.requests[-1])
        too_long = await two.http.post("/v1/responses", json={"model": "b", "input": document})
        assert too_long.status_code == 400 and "1" in too_long.json()["error"]["message"], too_long.text
        one_page = base64.b64encode(text_pdf(["page one"])).decode()
        document[0]["content"][0]["file_data"] = f"data:application/pdf;base64,{one_page}"  # type: ignore[index]
        assert (
            await two.http.post("/v1/responses", json={"model": "b", "input": document})
        ).status_code == 200
        b_page = page_size(two.b.requests[-1])
        assert b_page[0] < a_page[0] and b_page[1] < a_page[1], (b_page, a_page)


def page_size(request: pb.GenerateRequest) -> tuple[int, int]:
    """The pixel size of a request's (first) rendered PDF page."""
    (image,) = [
        part.image for message in request.messages for part in message.parts if part.HasField("image")
    ][:1]
    size: tuple[int, int] = Image.open(io.BytesIO(image.data)).size
    return size


async def test_a_model_has_its_own_generate_timeout(
    tmp_path: Path, settings: FacadeSettings, store: Store
) -> None:
    async with two_models(tmp_path, settings, store, "generate_timeout_s = 0.5") as two:
        for engine in (two.a, two.b):
            engine.script.text_chunks = ["slow ", "answer ", "here"]
            engine.script.delay_s = 0.3
        assert (await two.http.post("/v1/responses", json={"model": "a", "input": "hi"})).status_code == 200
        late = await two.http.post("/v1/responses", json={"model": "b", "input": "hi"})
        assert late.status_code == 504, late.text
        assert late.json()["error"]["code"] == "engine_timeout"
