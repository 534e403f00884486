"""Base64, image and file bytes never reach the logs: every logger at DEBUG, requests carrying a
unique marker in valid and invalid images and files, through success and error paths; the marker is
never logged."""

from __future__ import annotations

import base64
import io
import logging
import secrets
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from tests.facade.fake_engine import FakeEngine, Script
from tests.facade.helpers import in_process
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Store, create_app

MARKER = "QkFTRTY0TUFSS0VS" + secrets.token_hex(12)  # base64-alphabet text, unique per run


def marked_png() -> bytes:
    """A valid PNG whose bytes contain MARKER (a text chunk), so its base64 is unique too."""
    info = PngInfo()
    info.add_text("comment", MARKER * 4)
    buffer = io.BytesIO()
    Image.new("RGB", (4, 4), (1, 2, 3)).save(buffer, format="PNG", pnginfo=info)
    return buffer.getvalue()


PNG = marked_png()
PNG_B64 = base64.b64encode(PNG).decode("ascii")

# Every kind of image a client could send, well-formed or not: (label, image_url).
IMAGES = [
    ("valid", f"data:image/png;base64,{PNG_B64}"),
    ("bad base64", f"data:image/png;base64,{MARKER}!!{MARKER}"),
    ("not an image", "data:image/png;base64," + base64.b64encode(MARKER.encode() * 8).decode()),
    ("declared type mismatch", f"data:image/jpeg;base64,{PNG_B64}"),
    ("truncated", "data:image/png;base64," + base64.b64encode(PNG[: len(PNG) // 2]).decode()),
    ("no base64 flag", f"data:image/png,{MARKER}"),
    ("not a data url", f"{MARKER}.png"),
]


def fingerprints() -> list[str]:
    """What must never be logged: the marker, and windows of the valid image's base64."""
    windows = [PNG_B64[start : start + 24] for start in range(0, len(PNG_B64) - 24, 24)]
    return [MARKER, *windows]


@pytest.fixture
def all_logs(caplog: pytest.LogCaptureFixture) -> Iterator[pytest.LogCaptureFixture]:
    """Every logger at DEBUG, non-propagating ones included, into caplog."""
    loggers = [logging.getLogger(name) for name in list(logging.root.manager.loggerDict)]
    saved = [(logger, logger.level, logger.disabled) for logger in loggers]
    isolated = [logger for logger in loggers if not logger.propagate]
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
        logger.disabled = False
    for logger in isolated:
        logger.addHandler(caplog.handler)
    caplog.set_level(logging.DEBUG)
    yield caplog
    for logger in isolated:
        logger.removeHandler(caplog.handler)
    for logger, level, disabled in saved:
        logger.setLevel(level)
        logger.disabled = disabled


def user_image(url: str, *, stream: bool = False) -> dict[str, Any]:
    content = [{"type": "input_text", "text": "what is it?"}, {"type": "input_image", "image_url": url}]
    return {"input": [{"role": "user", "content": content}], "stream": stream}


def tool_output_image(url: str) -> dict[str, Any]:
    return {
        "input": [
            {"type": "function_call", "call_id": "c1", "name": "shot", "arguments": "{}"},
            {
                "type": "function_call_output",
                "call_id": "c1",
                "output": [{"type": "input_image", "image_url": url}],
            },
        ]
    }


async def test_image_payloads_never_reach_the_logs(
    all_logs: pytest.LogCaptureFixture,
    settings: FacadeSettings,
    engine_client: AsyncEngineClient,
    store: Store,
    engine: FakeEngine,
) -> None:
    app = create_app(settings, engine=engine_client, store=store)
    statuses: dict[str, int] = {}
    async with in_process(app) as http:
        for label, url in IMAGES:
            for name, body in (
                ("message", user_image(url)),
                ("stream", user_image(url, stream=True)),
                ("tool output", tool_output_image(url)),
            ):
                statuses[f"{label}/{name}"] = (await http.post("/v1/responses", json=body)).status_code
            statuses[f"{label}/tokens"] = (
                await http.post("/v1/responses/input_tokens", json=user_image(url))
            ).status_code
            statuses[f"{label}/conversation"] = (
                await http.post("/v1/conversations", json={"items": user_image(url)["input"]})
            ).status_code
        valid_url = IMAGES[0][1]
        # Engine failures with an image in the request: before output, and mid-stream.
        engine.script = Script(error=(grpc.StatusCode.INVALID_ARGUMENT, "image could not be decoded"))
        statuses["engine refuses"] = (
            await http.post("/v1/responses", json=user_image(valid_url))
        ).status_code
        engine.script = Script(error=(grpc.StatusCode.INTERNAL, "boom"), error_after=1)
        streamed = await http.post("/v1/responses", json=user_image(valid_url, stream=True))
        statuses["engine fails mid-stream"] = streamed.status_code
        assert '"type":"error"' in streamed.text
        # The stored items hold the image (the API returns it; logs must not).
        engine.script = Script()
        created = (await http.post("/v1/responses", json=user_image(valid_url))).json()
        items = await http.get(f"/v1/responses/{created['id']}/input_items")
        assert PNG_B64 in items.text
        # Remote URLs carrying the marker, refused (remote fetching is off).
        remote = f"https://images.example/{MARKER}.png?k={MARKER}"
        statuses["remote"] = (await http.post("/v1/responses", json=user_image(remote))).status_code

    assert statuses["valid/message"] == 200 and statuses["valid/stream"] == 200
    assert statuses["bad base64/message"] == 400 and statuses["engine refuses"] == 400
    assert all(status < 500 for status in statuses.values()), statuses
    logged = all_logs.text + "\n".join(repr(record.args) for record in all_logs.records)
    assert len(all_logs.records) > 20  # DEBUG really was captured (sse-starlette, the facade, ...)
    for fingerprint in fingerprints():
        assert fingerprint not in logged
    assert MARKER.encode() not in logged.encode("utf-8", "replace")


async def test_file_payloads_never_reach_the_logs(
    all_logs: pytest.LogCaptureFixture,
    settings: FacadeSettings,
    engine_client: AsyncEngineClient,
    store: Store,
    engine: FakeEngine,
) -> None:
    """The same for files (issue 14.2): uploads, downloads and input_file parts, valid or not."""
    from tests._pdfs import text_pdf

    text = f"notes {MARKER}\n".encode() * 4
    pdf = text_pdf([f"page {MARKER}"])
    zipped = b"PK\x03\x04" + MARKER.encode() * 4
    app = create_app(settings, engine=engine_client, store=store)
    statuses: dict[str, int] = {}

    def file_part(**fields: str) -> dict[str, Any]:
        return {"input": [{"role": "user", "content": [{"type": "input_file", **fields}]}]}

    async with in_process(app) as http:
        ids = {}
        for label, content in (("text", text), ("pdf", pdf), ("zip", zipped), ("pdf as vision", pdf)):
            purpose = "vision" if label == "pdf as vision" else "user_data"
            uploaded = await http.post(
                "/v1/files", files={"file": ("f.bin", content)}, data={"purpose": purpose}
            )
            statuses[f"upload {label}"] = uploaded.status_code
            if uploaded.status_code == 200:
                ids[label] = uploaded.json()["id"]
                statuses[f"download {label}"] = (
                    await http.get(f"/v1/files/{ids[label]}/content")
                ).status_code
                statuses[f"use {label}"] = (
                    await http.post("/v1/responses", json=file_part(file_id=ids[label]))
                ).status_code
        for label, content in (("text", text), ("pdf", pdf), ("zip", zipped)):
            inline = "data:application/pdf;base64," + base64.b64encode(content).decode()
            statuses[f"inline {label}"] = (
                await http.post("/v1/responses", json=file_part(file_data=inline))
            ).status_code
        statuses["bad base64"] = (
            await http.post("/v1/responses", json=file_part(file_data=f"{MARKER}!!{MARKER}"))
        ).status_code

    assert statuses["upload text"] == 200 and statuses["use pdf"] == 200 and statuses["inline text"] == 200
    assert statuses["upload zip"] == 400 and statuses["inline zip"] == 400 and statuses["bad base64"] == 400
    assert all(status < 500 for status in statuses.values()), statuses
    logged = all_logs.text + "\n".join(repr(record.args) for record in all_logs.records)
    assert MARKER not in logged and MARKER.encode() not in logged.encode("utf-8", "replace")
