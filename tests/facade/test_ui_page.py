"""`GET /ui`: three static files with a policy that allows this origin only, nothing fetched from
elsewhere, served without a key while every API call the page makes needs one as any client's
does. The page in a real browser: tests/e2e/test_ui_browser.py."""

from __future__ import annotations

import re
from pathlib import Path

import httpx
import pytest

from vlmserve.facade import FacadeSettings
from vlmserve.facade.settings.api_keys import ApiKeys

KEY = "sk-ui-test-key-0000000000"
FILES = Path(__file__).resolve().parents[2] / "facade" / "vlmserve" / "facade" / "routes" / "ui_files"


@pytest.fixture
def settings(settings: FacadeSettings) -> FacadeSettings:
    """The shared settings (tests/facade/fixtures.py) with API keys on."""
    return settings.replace(api_keys=ApiKeys.from_keys([KEY]))


async def test_the_page_and_its_files(http: httpx.AsyncClient) -> None:
    page = await http.get("/ui")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "default-src 'self'" in policy and "connect-src 'self'" in policy
    assert 'src="/ui/ui.js"' in page.text and 'href="/ui/ui.css"' in page.text
    for name, kind in (("ui.js", "text/javascript"), ("ui.css", "text/css")):
        asset = await http.get(f"/ui/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind)
    assert (await http.get("/ui/../app.py")).status_code == 404
    assert (await http.get("/ui/secret.txt")).status_code == 404
    root = await http.get("/")
    assert root.status_code == 307 and root.headers["location"] == "/ui"


async def test_served_without_a_key_but_the_api_is_not(http: httpx.AsyncClient) -> None:
    assert (await http.get("/ui")).status_code == 200
    assert (await http.get("/v1/models")).status_code == 401
    # Readiness is probed without a key, and then says only whether it is ready.
    assert (await http.get("/readyz")).json() == {"status": "ready"}
    models = await http.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"})
    assert models.status_code == 200


def test_nothing_is_fetched_from_elsewhere() -> None:
    for path in FILES.iterdir():
        text = path.read_text(encoding="utf-8")
        assert not re.search(r"https?://|//[a-z0-9.-]+\.[a-z]{2,}/", text), path.name
        # The API paths the page calls exist under these names (routes/models.py, responses.py).
        if path.name == "ui.js":
            for called in ('"/readyz"', '"/v1/models"', '"/v1/responses"'):
                assert called in text


def test_the_page_is_not_in_the_openapi_document(http: httpx.AsyncClient) -> None:
    from vlmserve.facade.routes import ui

    assert all(not route.include_in_schema for route in ui.router.routes)  # type: ignore[attr-defined]
