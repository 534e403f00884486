"""Anthropic's Files API on `/v1/files` (issue 36, conformance round 4): the anthropic SDK's
`beta.files` uploads without `purpose` and gets Anthropic's file metadata back; the raw wire is
asserted, then the SDK's own round trip and a Messages request naming the file."""

from __future__ import annotations

import datetime
from collections.abc import AsyncIterator

import anthropic
import httpx
import pytest

from tests._pdfs import text_pdf
from tests.facade.fake_engine import FakeEngine

PDF = text_pdf(["Quarterly report"])
BETA = {"anthropic-beta": "files-api-2025-04-14", "anthropic-version": "2023-06-01"}


@pytest.fixture
async def sdk(server_url: str) -> AsyncIterator[anthropic.AsyncAnthropic]:
    client = anthropic.AsyncAnthropic(base_url=server_url, api_key="unused", max_retries=0, timeout=10)
    yield client
    await client.close()


async def test_upload_without_purpose_answers_anthropic_metadata(http: httpx.AsyncClient) -> None:
    reply = await http.post(
        "/v1/files?beta=true", files={"file": ("report.pdf", PDF, "application/pdf")}, headers=BETA
    )
    assert reply.status_code == 200, reply.text
    body = reply.json()
    assert set(body) == {"id", "type", "filename", "mime_type", "size_bytes", "created_at", "downloadable"}
    assert (body["type"], body["filename"], body["mime_type"], body["size_bytes"]) == (
        "file",
        "report.pdf",
        "application/pdf",
        len(PDF),
    )
    assert body["created_at"].endswith("Z")
    created = datetime.datetime.fromisoformat(body["created_at"])
    assert abs(created.timestamp() - datetime.datetime.now(datetime.UTC).timestamp()) < 60
    # Retrieved, listed and deleted in the same shapes.
    assert (await http.get(f"/v1/files/{body['id']}", headers=BETA)).json() == body
    listed = (await http.get("/v1/files", headers=BETA)).json()
    assert listed == {"data": [body], "first_id": body["id"], "last_id": body["id"], "has_more": False}
    deleted = await http.delete(f"/v1/files/{body['id']}", headers=BETA)
    assert deleted.json() == {"id": body["id"], "type": "file_deleted"}


async def test_without_the_beta_header_purpose_is_still_required(http: httpx.AsyncClient) -> None:
    reply = await http.post("/v1/files", files={"file": ("report.pdf", PDF, "application/pdf")})
    assert reply.status_code == 400
    assert reply.json()["error"]["param"] == "purpose"


async def test_an_expiry_is_refused_not_dropped(http: httpx.AsyncClient) -> None:
    reply = await http.post(
        "/v1/files",
        files={"file": ("report.pdf", PDF, "application/pdf")},
        data={"expires_in_seconds": "3600"},
        headers=BETA,
    )
    assert reply.status_code == 400
    assert reply.json()["type"] == "error" and "expires_in_seconds" in reply.json()["error"]["message"]


async def test_the_sdk_uploads_and_a_message_reads_the_file(
    sdk: anthropic.AsyncAnthropic, engine: FakeEngine
) -> None:
    uploaded = await sdk.beta.files.upload(file=("report.pdf", PDF, "application/pdf"))
    assert (uploaded.type, uploaded.mime_type, uploaded.size_bytes, uploaded.downloadable) == (
        "file",
        "application/pdf",
        len(PDF),
        True,
    )
    assert (await sdk.beta.files.retrieve_metadata(uploaded.id)).id == uploaded.id
    message = await sdk.beta.messages.create(
        model="default",
        max_tokens=16,
        betas=["files-api-2025-04-14"],
        messages=[
            {
                "role": "user",
                "content": [
                    {"type": "document", "source": {"type": "file", "file_id": uploaded.id}},
                    {"type": "text", "text": "Summarise."},
                ],
            }
        ],
    )
    assert message.content[0].type == "text"
    texts = [part.text.text for m in engine.requests[0].messages for part in m.parts if part.HasField("text")]
    assert any("Quarterly report" in text for text in texts)
