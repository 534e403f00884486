"""`/v1/files` (issue 14.2): upload, list, retrieve, download and delete, per API key, sniffed,
size-capped; then the files used by id in responses. The openai SDK's `client.files` and plain
HTTP against the scripted engine."""

from __future__ import annotations

import base64
import io
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from fastapi import FastAPI
from PIL import Image

from tests._pdfs import text_pdf
from tests.facade.fake_engine import FakeEngine
from tests.facade.helpers import in_process, owner_id
from tests.responses.responses_testkit import RED
from vlmserve.client import AsyncEngineClient
from vlmserve.engine.prep.lowering import lower_messages
from vlmserve.facade import FacadeSettings, Store, Timeouts, create_app
from vlmserve.facade.settings import Files
from vlmserve.facade.settings.api_keys import ApiKeys

PDF = text_pdf(["Quarterly report", "Totals"])


@pytest.fixture
def settings(tmp_path: Path) -> FacadeSettings:
    return FacadeSettings(
        store_path=tmp_path / "facade.sqlite3",
        timeouts=Timeouts(generate=30.0, control=5.0, stream_first_message=1.0),
        files=Files(max_file_bytes=64 * 1024, max_file_bytes_per_key=200 * 1024, max_pdf_pages=4),
    )


async def upload(
    http: httpx.AsyncClient, content: bytes, *, name: str = "a.pdf", purpose: str = "user_data", **kw: Any
) -> httpx.Response:
    return await http.post(
        "/v1/files",
        files={"file": (name, content, "application/octet-stream")},
        data={"purpose": purpose},
        **kw,
    )


async def test_the_sdk_round_trip(sdk: openai.AsyncOpenAI, settings: FacadeSettings) -> None:
    created = await sdk.files.create(file=("report.pdf", PDF, "application/pdf"), purpose="user_data")
    assert (created.object, created.filename, created.bytes, created.purpose) == (
        "file",
        "report.pdf",
        len(PDF),
        "user_data",
    )
    assert created.id.startswith("file-") and created.status == "processed"
    assert (await sdk.files.retrieve(created.id)) == created
    image = await sdk.files.create(file=("red.png", RED), purpose="vision")
    listed = [file.id async for file in sdk.files.list()]
    assert listed == [image.id, created.id] or sorted(listed) == sorted([image.id, created.id])
    assert [file.id async for file in sdk.files.list(purpose="vision")] == [image.id]
    assert (await sdk.files.content(created.id)).content == PDF
    deleted = await sdk.files.delete(created.id)
    assert (deleted.id, deleted.deleted) == (created.id, True)
    with pytest.raises(openai.NotFoundError):
        await sdk.files.retrieve(created.id)
    # On disk beside the store, one folder per key; nothing of it in the response store.
    folder = settings.store_path.parent / "files" / "anonymous"
    # (`.lock`: the owner's lock, taken while a quota is checked and a file written.)
    assert sorted(path.name for path in folder.iterdir()) == [".lock", image.id, image.id + ".json"]


async def test_list_pages_and_orders(http: httpx.AsyncClient) -> None:
    ids = [
        (await upload(http, f"note {index}\n".encode(), name=f"n{index}.txt")).json()["id"]
        for index in range(3)
    ]
    first = (await http.get("/v1/files", params={"limit": 2, "order": "asc"})).json()
    assert first["has_more"] is True and len(first["data"]) == 2
    rest = (
        await http.get("/v1/files", params={"limit": 2, "order": "asc", "after": first["last_id"]})
    ).json()
    assert rest["has_more"] is False
    assert sorted([*(f["id"] for f in first["data"]), *(f["id"] for f in rest["data"])]) == sorted(ids)


async def test_content_is_served_with_the_sniffed_type(http: httpx.AsyncClient) -> None:
    # An HTML page uploaded as an "image/png" comes back as text, never as a page of this origin.
    created = (await upload(http, b"<script>alert(1)</script>", name="x.png")).json()
    content = await http.get(f"/v1/files/{created['id']}/content")
    assert content.headers["content-type"] == "text/plain; charset=utf-8"
    assert content.headers["x-content-type-options"] == "nosniff"
    assert content.headers["content-disposition"].startswith("attachment;")
    pdf = (await upload(http, PDF, name="../../etc/r.pdf")).json()
    assert pdf["filename"] == "r.pdf"
    assert (await http.get(f"/v1/files/{pdf['id']}/content")).headers["content-type"] == "application/pdf"


BAD_UPLOADS = [
    pytest.param({"purpose": "fine-tune"}, PDF, "a.pdf", 400, "purpose", "invalid_value", id="other-purpose"),
    pytest.param({}, PDF, "a.pdf", 400, "purpose", "missing_required_parameter", id="no-purpose"),
    pytest.param({"purpose": "vision"}, PDF, "a.pdf", 400, "file", "invalid_value", id="vision-not-image"),
    pytest.param(
        {"purpose": "user_data"},
        b"PK\x03\x04" + bytes(64),
        "a.docx",
        400,
        "file",
        "unsupported_file",
        id="zip",
    ),
    pytest.param({"purpose": "user_data"}, b"", "a.txt", 400, "file", "invalid_file", id="empty"),
    pytest.param(
        {"purpose": "user_data"}, b"x" * (80 * 1024), "a.txt", 413, "file", "file_too_large", id="too-large"
    ),
]


@pytest.mark.parametrize(("data", "content", "name", "status", "param", "code"), BAD_UPLOADS)
async def test_upload_refusals(
    http: httpx.AsyncClient,
    data: dict[str, str],
    content: bytes,
    name: str,
    status: int,
    param: str,
    code: str,
) -> None:
    response = await http.post("/v1/files", files={"file": (name, content, "image/png")}, data=data)
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert (error["param"], error["code"]) == (param, code)


async def test_upload_without_a_file_field(http: httpx.AsyncClient) -> None:
    response = await http.post("/v1/files", data={"purpose": "user_data"})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "file"


async def test_upload_quota_per_key(http: httpx.AsyncClient) -> None:
    for index in range(3):
        assert (await upload(http, b"y" * (60 * 1024), name=f"{index}.txt")).status_code == 200
    refused = await upload(http, b"y" * (60 * 1024), name="3.txt")
    assert refused.status_code == 429 and refused.json()["error"]["code"] == "storage_quota_exceeded"


@pytest.mark.parametrize("method", ["GET", "DELETE"])
@pytest.mark.parametrize("suffix", ["", "/content"])
async def test_unknown_ids_are_404(http: httpx.AsyncClient, method: str, suffix: str) -> None:
    if method == "DELETE" and suffix:
        return
    for file_id in ("file-" + "0" * 48, "file-../../facade.sqlite3", "nope"):
        response = await http.request(method, f"/v1/files/{file_id}{suffix}")
        assert response.status_code == 404, response.text
        assert response.json()["error"]["code"] == "not_found"


async def test_files_belong_to_their_key(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store, engine: FakeEngine
) -> None:
    keyed = settings.model_copy(update={"api_keys": ApiKeys.from_keys(["key-a", "key-b"])})
    app: FastAPI = create_app(keyed, engine=engine_client, store=store)
    async with in_process(app) as http:
        a = {"authorization": "Bearer key-a"}
        b = {"authorization": "Bearer key-b"}
        created = (await upload(http, RED, name="red.png", headers=a)).json()
        assert (await http.get(f"/v1/files/{created['id']}", headers=a)).status_code == 200
        assert (await http.get(f"/v1/files/{created['id']}", headers=b)).status_code == 404
        assert (await http.get("/v1/files", headers=b)).json()["data"] == []
        assert (await http.delete(f"/v1/files/{created['id']}", headers=b)).status_code == 404
        body = {
            "model": "default",
            "input": [{"role": "user", "content": [{"type": "input_image", "file_id": created["id"]}]}],
        }
        other = await http.post("/v1/responses", json=body, headers=b)
        assert other.status_code == 400
        assert other.json()["error"]["param"] == "input[0].content[0].file_id"
        assert (await http.post("/v1/responses", json=body, headers=a)).status_code == 200
        assert (settings.files_directory() / owner_id("key-a") / created["id"]).exists()


async def test_responses_use_uploaded_files(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    pdf = (await upload(http, PDF, name="report.pdf")).json()["id"]
    image = (await upload(http, RED, name="red.png", purpose="vision")).json()["id"]
    body = {
        "model": "default",
        "input": [
            {
                "role": "user",
                "content": [{"type": "input_text", "text": "read"}, {"type": "input_file", "file_id": pdf}],
            },
            {"type": "function_call", "call_id": "c1", "name": "screenshot", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [{"type": "input_image", "file_id": image}],
            },
        ],
    }
    response = await http.post("/v1/responses", json=body)
    assert response.status_code == 200, response.text
    messages = lower_messages(engine.requests[0].messages)  # as the engine renders them
    texts = [part.text.text for part in messages[0].parts if part.HasField("text")]
    assert texts == [
        "read",
        "[file report.pdf, page 1 of 2]\nQuarterly report",
        "[file report.pdf, page 2 of 2]\nTotals",
    ]
    assert sum(part.HasField("image") for part in messages[0].parts) == 2
    # The tool output's image is lowered into the user turn after it, as every image is.
    assert any(part.image.data == RED for part in messages[-1].parts)
    # The stored input names the file; listing the input items gives it back as sent.
    items = (
        await http.get(f"/v1/responses/{response.json()['id']}/input_items", params={"order": "asc"})
    ).json()
    assert items["data"][0]["content"][1] == {"type": "input_file", "file_id": pdf}


async def test_inline_file_data_and_its_limits(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    url = "data:application/pdf;base64," + base64.b64encode(PDF).decode()
    part = {"type": "input_file", "file_data": url, "filename": "r.pdf"}
    ok = await http.post(
        "/v1/responses", json={"model": "default", "input": [{"role": "user", "content": [part]}]}
    )
    assert ok.status_code == 200, ok.text
    five_pages = text_pdf(["a", "b", "c", "d", "e"])
    part["file_data"] = "data:application/pdf;base64," + base64.b64encode(five_pages).decode()
    refused = await http.post(
        "/v1/responses", json={"model": "default", "input": [{"role": "user", "content": [part]}]}
    )
    assert refused.status_code == 400
    assert refused.json()["error"]["param"] == "input[0].content[0]"
    assert "5 pages" in refused.json()["error"]["message"]


async def test_pdf_pages_count_against_the_image_limit(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    limited = settings.model_copy(
        update={"limits": settings.limits.model_copy(update={"max_images_per_request": 3})}
    )
    app = create_app(limited, engine=engine_client, store=store)
    async with in_process(app) as http:
        url = "data:application/pdf;base64," + base64.b64encode(PDF).decode()
        parts = [{"type": "input_file", "file_data": url}, {"type": "input_file", "file_data": url}]
        refused = await http.post(
            "/v1/responses", json={"model": "default", "input": [{"role": "user", "content": parts}]}
        )
        assert refused.status_code == 400, refused.text
        assert refused.json()["error"]["param"] == "input[0].content[1]"


async def test_files_by_id_count_against_the_request_size(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    limited = settings.model_copy(
        update={"limits": settings.limits.model_copy(update={"max_request_bytes": 8000})}
    )
    app = create_app(limited, engine=engine_client, store=store)
    async with in_process(app) as http:
        text = (await upload(http, b"x" * 3000, name="x.txt")).json()["id"]
        part = {"type": "input_file", "file_id": text}
        for uses, status in ((2, 200), (3, 400)):
            reply = await http.post(
                "/v1/responses",
                json={"model": "default", "input": [{"role": "user", "content": [part] * uses}]},
            )
            assert reply.status_code == status, reply.text
        error = reply.json()["error"]
        # Every use reads the file again: the third passes the request size, on its own part.
        assert (error["code"], error["param"]) == ("files_too_large", "input[0].content[2].file_id")
        assert "more than 8000 bytes" in error["message"]


def test_rendered_page_image_is_a_png() -> None:
    # (A guard for the helper the e2e test relies on: pages come back as PNG, not JPEG.)
    from vlmserve.common.documents import DocumentLimits, render_pdf

    (page, _) = render_pdf(PDF, DocumentLimits())
    assert Image.open(io.BytesIO(page.png)).format == "PNG"


async def test_chat_completions_file_parts(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    """The chat form `{"type": "file", "file": {...}}` is the same `input_file` (LangChain's default mode)."""
    pdf = (await upload(http, PDF, name="report.pdf")).json()["id"]
    inline = "data:application/pdf;base64," + base64.b64encode(PDF).decode()
    messages = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "read"},
                {"type": "file", "file": {"file_id": pdf}},
                {"type": "file", "file": {"file_data": inline, "filename": "copy.pdf"}},
            ],
        }
    ]
    ok = await http.post("/v1/chat/completions", json={"model": "default", "messages": messages})
    assert ok.status_code == 200, ok.text
    texts = [part.text.text for part in engine.requests[-1].messages[0].parts if part.HasField("text")]
    assert texts[1].startswith("[file report.pdf, page 1 of 2]")
    assert texts[3].startswith("[file copy.pdf, page 1 of 2]")
    messages[0]["content"] = [{"type": "file", "file": {"file_id": "file-" + "1" * 48}}]
    missing = await http.post("/v1/chat/completions", json={"model": "default", "messages": messages})
    assert missing.status_code == 400
    assert missing.json()["error"]["param"] == "messages[0].content[0].file.file_id"


async def test_conversation_items_resolve_files(http: httpx.AsyncClient, engine: FakeEngine) -> None:
    pdf = (await upload(http, PDF, name="report.pdf")).json()["id"]
    item = {"role": "user", "content": [{"type": "input_file", "file_id": pdf}]}
    created = await http.post("/v1/conversations", json={"items": [item]})
    assert created.status_code == 200, created.text
    conversation = created.json()["id"]
    # Deleting the file later does not change the conversation: its turns were translated when added.
    assert (await http.delete(f"/v1/files/{pdf}")).status_code == 200
    answered = await http.post(
        "/v1/responses", json={"model": "default", "conversation": conversation, "input": "and then?"}
    )
    assert answered.status_code == 200, answered.text
    first = engine.requests[-1].messages[0]
    assert [part.WhichOneof("kind") for part in first.parts] == ["text", "image", "text", "image"]
    missing = await http.post(f"/v1/conversations/{conversation}/items", json={"items": [item]})
    assert missing.status_code == 400
    assert missing.json()["error"]["param"] == "items[0].content[0].file_id"


async def test_a_damaged_record_is_a_missing_file(http: httpx.AsyncClient, settings: FacadeSettings) -> None:
    created = (await upload(http, b"kept\n", name="a.txt")).json()["id"]
    damaged = (await upload(http, b"lost\n", name="b.txt")).json()["id"]
    (settings.files_directory() / "anonymous" / f"{damaged}.json").write_text("{not json")
    assert (await http.get(f"/v1/files/{damaged}")).status_code == 404
    assert [f["id"] for f in (await http.get("/v1/files")).json()["data"]] == [created]
