"""The /ui page in a real browser: Debian's headless Chromium, driven over WebDriver (chromedriver's
HTTP API, no client library), against the engine + facade on the squares model. The page lists
the model, shows readiness, takes the typed question and an attached squares image, streams the
answer with usage and timing — and the answer counts the squares; then the same with a PDF
page. The screenshot must show the page as a person would see it: the attached image's colour in
its preview and the green readiness pill.

Chromium and chromedriver come from scripts/install-system-deps.sh (apt: chromium,
chromium-driver); without them the test skips.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from PIL import Image

from tests._pdfs import squares_pdf
from tests._services import BIN, REPO, free_port, process_env
from training.squares import PALETTE, QUESTION, make_samples

pytestmark = [
    pytest.mark.slow,
    pytest.mark.needs_model,
    pytest.mark.skipif(
        shutil.which("chromedriver") is None or shutil.which("chromium") is None,
        reason="needs Debian's chromium and chromium-driver (scripts/install-system-deps.sh)",
    ),
]

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--window-size=1200,900",
]
ELEMENT = "element-6066-11e4-a52e-4f735466cecf"
READY_GREEN = (0xD7, 0xF5, 0xDF)


class Browser:
    """The few WebDriver calls the test needs."""

    def __init__(self, base: str, session: str) -> None:
        self.http = httpx.Client(base_url=f"{base}/session/{session}", timeout=60)

    def call(self, method: str, path: str, body: dict[str, Any] | None = None) -> Any:
        response = self.http.request(method, path, json=body)
        assert response.status_code == 200, response.text[:2000]
        return response.json()["value"]

    def find(self, css: str) -> str:
        return str(self.call("POST", "/element", {"using": "css selector", "value": css})[ELEMENT])

    def script(self, source: str) -> Any:
        return self.call("POST", "/execute/sync", {"script": source, "args": []})

    def wait_for(self, source: str, timeout: float = 60) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = self.script(source)
            if value:
                return value
            assert time.monotonic() < deadline, f"timed out waiting for: {source}"
            time.sleep(0.2)


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[Browser]:
    port = free_port()
    # `make test` preloads Debian's OpenBLAS for MLX (LD_PRELOAD); Chromium's renderer dies with
    # it preloaded ("Unable to receive message from renderer"), so the browser runs without it.
    env = {name: value for name, value in os.environ.items() if name != "LD_PRELOAD"}
    driver = subprocess.Popen(
        ["chromedriver", f"--port={port}"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env
    )
    base = f"http://127.0.0.1:{port}"
    session = None
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                if httpx.get(f"{base}/status", timeout=1).json()["value"]["ready"]:
                    break
            except (httpx.HTTPError, KeyError, ValueError):
                pass
            assert time.monotonic() < deadline, "chromedriver did not start"
            time.sleep(0.1)
        options = {
            "binary": shutil.which("chromium"),
            "args": [*CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'profile'}"],
        }
        created = httpx.post(
            f"{base}/session",
            json={"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": options}}},
            timeout=60,
        )
        assert created.status_code == 200, created.text[:2000]
        session = created.json()["value"]["sessionId"]
        yield Browser(base, session)
    finally:
        if session is not None:
            httpx.delete(f"{base}/session/{session}", timeout=30)
        driver.terminate()
        try:
            driver.wait(timeout=10)
        except subprocess.TimeoutExpired:
            driver.kill()
            driver.wait()


def _has_colour(image: Image.Image, colour: tuple[int, int, int], at_least: int, slack: int = 6) -> bool:
    counts = image.convert("RGB").getcolors(maxcolors=1 << 24) or []
    near = sum(
        n for n, pixel in counts if all(abs(a - b) <= slack for a, b in zip(pixel, colour, strict=True))
    )
    return near >= at_least


def test_ask_about_an_image_in_the_page(browser: Browser, squares_facade_url: str, tmp_path: Path) -> None:
    (sample,) = make_samples(4242, 1)
    picture = tmp_path / "squares.png"
    picture.write_bytes(sample.png_bytes())

    browser.call("POST", "/url", {"url": f"{squares_facade_url}/ui"})
    browser.wait_for("return document.querySelectorAll('#model option').length > 0")
    browser.wait_for("return document.getElementById('health').textContent === 'ready'")
    assert browser.script("return document.getElementById('models').textContent").strip()

    browser.call("POST", f"/element/{browser.find('#prompt')}/value", {"text": QUESTION})
    browser.call("POST", f"/element/{browser.find('#file')}/value", {"text": str(picture)})
    browser.wait_for("return !document.getElementById('preview').hidden")
    browser.call("POST", f"/element/{browser.find('#send')}/click", {})
    browser.wait_for("return document.body.dataset.answered === '1'")

    answer = browser.script("return document.getElementById('answer').textContent")
    stats = browser.script("return document.getElementById('stats').textContent")
    error = browser.script("return document.getElementById('error').textContent")
    assert not error, error
    assert answer.strip() == sample.answer, (answer, sample.answer)
    # No key is needed here, so the page asks for none.
    assert browser.script("return document.getElementById('key-row').offsetParent === null")
    assert "input " in stats and "output " in stats and "total " in stats and "first token" in stats, stats

    shot = Image.open(io.BytesIO(base64.b64decode(browser.call("GET", "/screenshot"))))
    shot.save(tmp_path / "ui.png")
    assert shot.size[0] >= 1000 and shot.size[1] >= 700, shot.size
    # The preview shows the attached image (its squares' colour), and readiness is green.
    assert _has_colour(shot, PALETTE[sample.colour], at_least=200), tmp_path / "ui.png"
    assert _has_colour(shot, READY_GREEN, at_least=100), tmp_path / "ui.png"

    # A PDF: its page reaches the model as an image (the same question, another sample).
    (page_sample,) = make_samples(4343, 1)
    document = tmp_path / "squares.pdf"
    document.write_bytes(squares_pdf([page_sample]))
    browser.script("delete document.body.dataset.answered")
    browser.call("POST", f"/element/{browser.find('#file')}/value", {"text": str(document)})
    browser.wait_for("return document.getElementById('attached').textContent.startsWith('squares.pdf')")
    assert browser.script("return document.getElementById('preview').hidden")
    browser.call("POST", f"/element/{browser.find('#send')}/click", {})
    browser.wait_for("return document.body.dataset.answered === '1'")
    assert not browser.script("return document.getElementById('error').textContent")
    answer = browser.script("return document.getElementById('answer').textContent")
    assert answer.strip() == page_sample.answer, (answer, page_sample.answer)


KEY = "sk-ui-browser-key-0000000000"


@pytest.fixture
def keyed_facade(squares_engine_address: str, tmp_path: Path) -> Iterator[str]:
    """A facade with API keys on, in front of the squares engine."""
    keys = tmp_path / "keys"
    keys.write_text(KEY + "\n", encoding="utf-8")
    port = free_port()
    log = (tmp_path / "facade.log").open("wb")
    process = subprocess.Popen(
        [str(BIN / "vlmserve-facade"), "--engine-address", squares_engine_address, "--port", str(port),
         "--store-path", str(tmp_path / "store.sqlite3"), "--files-dir", str(tmp_path / "files"),
         "--api-keys-file", str(keys)],
        stdout=log, stderr=subprocess.STDOUT, env=process_env(), cwd=REPO,
    )  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            assert process.poll() is None, (tmp_path / "facade.log").read_text()[-3000:]
            try:
                if httpx.get(
                    f"{url}/readyz", headers={"Authorization": f"Bearer {KEY}"}, timeout=2
                ).is_success:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "facade.log").read_text()[-3000:]
            time.sleep(0.2)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def test_with_api_keys_the_page_asks_for_one(browser: Browser, keyed_facade: str, tmp_path: Path) -> None:
    """The page is served without a key; its API calls are refused until the key is typed, then
    they carry it like any client's."""
    (sample,) = make_samples(4444, 1)
    picture = tmp_path / "squares.png"
    picture.write_bytes(sample.png_bytes())
    browser.call("POST", "/url", {"url": f"{keyed_facade}/ui"})
    browser.wait_for("return !document.getElementById('key-row').hidden")
    assert "API key" in browser.wait_for("return document.getElementById('error').textContent")
    assert browser.script("return document.querySelectorAll('#model option').length") == 0

    browser.call("POST", f"/element/{browser.find('#key')}/value", {"text": KEY})
    browser.call("POST", f"/element/{browser.find('#prompt')}/click", {})  # the key field's change
    browser.wait_for("return document.querySelectorAll('#model option').length > 0")
    browser.wait_for("return document.getElementById('health').textContent === 'ready'")
    browser.call("POST", f"/element/{browser.find('#prompt')}/value", {"text": QUESTION})
    browser.call("POST", f"/element/{browser.find('#file')}/value", {"text": str(picture)})
    browser.wait_for("return !document.getElementById('preview').hidden")
    browser.script("document.getElementById('error').textContent = ''")
    browser.call("POST", f"/element/{browser.find('#send')}/click", {})
    browser.wait_for("return document.body.dataset.answered === '1'")
    assert not browser.script("return document.getElementById('error').textContent")
    answer = browser.script("return document.getElementById('answer').textContent")
    assert answer.strip() == sample.answer, (answer, sample.answer)
