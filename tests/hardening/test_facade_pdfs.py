"""Hostile PDFs at the facade (issue 26, items 1-3 and 7): each a 400 naming the file's field,
rendered in worker processes under memory and CPU limits, stopped when the client goes away,
and never on the threads plain requests translate on."""

from __future__ import annotations

import asyncio
import base64
import resource
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi import FastAPI

from tests._hostile_pdfs import jpeg_pdf, nested_forms_pdf, page_pdf, unloadable_page_pdf
from tests._pdfs import text_pdf
from tests.hardening._image_corpus import jpeg_scan_bomb
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Store, Timeouts, create_app
from vlmserve.facade.documents.pdf_workers import PdfWorkers
from vlmserve.facade.settings import Files, Limits
from vlmserve.facade.settings.api_keys import ApiKeys

ALICE = "sk-alice-0123456789abcdefxx"
BOB = "sk-bob-fedcba9876543210xx"
# Renders for ~20 s and grows past 1 GiB in-process (4^12 drawings of nested forms, 3.7 KB).
FORMS_BOMB = nested_forms_pdf(depth=12, fanout=4)


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def pdf_body(pdf: bytes) -> dict[str, Any]:
    data = "data:application/pdf;base64," + base64.b64encode(pdf).decode("ascii")
    part = {"type": "input_file", "filename": "x.pdf", "file_data": data}
    return {"input": [{"role": "user", "content": [{"type": "input_text", "text": "read"}, part]}]}


@pytest.fixture
def settings(tmp_path: Path) -> FacadeSettings:
    return FacadeSettings(
        store_path=tmp_path / "facade.sqlite3",
        timeouts=Timeouts(generate=30.0, control=5.0, stream_first_message=1.0),
        api_keys=ApiKeys.from_keys([ALICE, BOB]),
        # One plain translation thread: a PDF holding it would hold every plain request.
        limits=Limits(translation_workers=1),
        files=Files(pdf_workers=1, pdf_worker_memory_mib=256, pdf_worker_cpu_s=30, pdf_timeout_s=60),
    )


@pytest.fixture
def app(settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store) -> FastAPI:
    return create_app(settings, engine=engine_client, store=store)


def workers_of(app: FastAPI) -> PdfWorkers:
    return app.state.facade.responses.pdf_workers  # type: ignore[no-any-return]


@pytest.fixture
def server_lifespan() -> str:
    return "on"  # the PDF workers start and stop with the app


HOSTILE = [
    pytest.param(page_pdf(0.001, 1e8), "invalid_file", "width of 0.001 pt", id="one-huge-side"),
    pytest.param(
        unloadable_page_pdf(), "invalid_file", "page 2 of the PDF could not be loaded", id="page-fails"
    ),
    pytest.param(
        jpeg_pdf(jpeg_scan_bomb(2000, 2000, scans=500), width=2000, height=2000, pages=4),
        "file_too_complex",
        "more than 64 scans",
        id="jpeg-scan-bomb",
    ),
    pytest.param(FORMS_BOMB, "file_too_complex", "256 MiB of memory", id="nested-forms"),
]


@pytest.mark.parametrize(("pdf", "code", "says"), HOSTILE)
async def test_hostile_pdfs_are_a_400_naming_the_file(
    server_url: str, app: FastAPI, pdf: bytes, code: str, says: str
) -> None:
    before_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    async with httpx.AsyncClient(base_url=server_url, timeout=60) as client:
        answer = await client.post("/v1/responses", json=pdf_body(pdf), headers=bearer(ALICE))
    assert answer.status_code == 400, answer.text
    error = answer.json()["error"]
    assert (error["param"], error["code"]) == ("input[0].content[1]", code)
    assert says in error["message"] and '"x.pdf"' in error["message"]
    # Rendered elsewhere: this process (the facade's) never held the bomb's memory. Generous:
    # in-process the forms bomb alone passes 1 GiB.
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before_kib < 200 * 1024


async def test_ordinary_pdfs_still_render_in_the_workers(server_url: str, app: FastAPI) -> None:
    async with httpx.AsyncClient(base_url=server_url, timeout=60) as client:
        answer = await client.post(
            "/v1/responses", json=pdf_body(text_pdf(["one", "two"])), headers=bearer(ALICE)
        )
    assert answer.status_code == 200, answer.text
    assert workers_of(app).killed == 0


async def _post_pdf(url: str, pdf: bytes) -> httpx.Response:
    async with httpx.AsyncClient(base_url=url, timeout=120) as client:
        return await client.post("/v1/responses", json=pdf_body(pdf), headers=bearer(ALICE))


async def _until(condition: Any, seconds: float = 20.0) -> None:
    for _ in range(int(seconds / 0.05)):
        if condition():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not met")


async def test_plain_requests_never_wait_behind_pdfs_and_gone_clients_stop_their_pdf(
    server_url: str, app: FastAPI
) -> None:
    """Three slow PDFs from one key (one renders, two wait for the one worker), then another
    key's "hi": it is answered while every PDF is still pending. The PDFs' clients then leave:
    the worker rendering is killed and the waiting ones never start."""
    workers = workers_of(app)
    # Room for ~20 s of rendering: only the disconnect can end it within the test.
    workers.memory_bytes = 2**30
    pdfs = [asyncio.create_task(_post_pdf(server_url, FORMS_BOMB)) for _ in range(3)]
    await _until(lambda: workers._slots._value == 0)  # one is rendering
    async with httpx.AsyncClient(base_url=server_url, timeout=60) as client:
        hi = await client.post("/v1/responses", json={"input": "hi"}, headers=bearer(BOB))
    assert hi.status_code == 200, hi.text
    assert not any(task.done() for task in pdfs)
    for task in pdfs:
        task.cancel()
    await asyncio.gather(*pdfs, return_exceptions=True)
    # Killed on the disconnect, not at the memory limit or the 60 s deadline.
    await _until(lambda: workers.killed >= 1 and workers._slots._value == 1)
    assert workers.killed == 1
