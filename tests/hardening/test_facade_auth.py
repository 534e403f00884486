"""Facade API keys: a tiny FastAPI app wired the way the real facade is meant to be."""

from __future__ import annotations

import hmac
import re
from pathlib import Path
from typing import Annotated

import pytest
from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.middleware.cors import CORSMiddleware
from fastapi.testclient import TestClient

from tests.facade.helpers import owner_id
from vlmserve.facade.app import create_app
from vlmserve.facade.http.api_keys import (
    ANONYMOUS_OWNER,
    install_api_keys,
    owner_of,
    require_owner,
)
from vlmserve.facade.http.errors import install_error_handlers
from vlmserve.facade.settings import FacadeSettings
from vlmserve.facade.settings.api_keys import API_KEYS_ENV, API_KEYS_FILE_ENV, ApiKeys
from vlmserve.server import secrets

KEY = "sk-test-0123456789abcdef"
OTHER_KEY = "sk-test-fedcba9876543210"
# A route may also take the owner as a parameter: require_owner returns it.
Owner = Annotated[str, Depends(require_owner)]
INCORRECT = {
    "error": {
        "message": "Incorrect API key provided.",
        "type": "invalid_request_error",
        "param": None,
        "code": "invalid_api_key",
    }
}


def make_app(keys: ApiKeys | None) -> FastAPI:
    app = FastAPI()
    install_error_handlers(app)
    if keys is not None:
        install_api_keys(app, keys)
    protected = APIRouter(dependencies=[Depends(require_owner)])

    @app.get("/healthz")
    async def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @protected.get("/v1/whoami")
    async def whoami(owner: Owner) -> dict[str, str]:
        return {"owner": owner}

    @protected.get("/v1/models")
    async def models(request: Request) -> dict[str, str]:
        return {"object": "list", "owner": owner_of(request)}

    app.include_router(protected)
    return app


@pytest.fixture
def client() -> TestClient:
    return TestClient(make_app(ApiKeys.from_keys([KEY, OTHER_KEY])))


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


@pytest.mark.parametrize("key", [KEY, OTHER_KEY])
def test_each_configured_key_is_accepted_and_named_by_its_owner_id(client: TestClient, key: str) -> None:
    reply = client.get("/v1/whoami", headers=bearer(key))
    assert reply.status_code == 200
    assert reply.json() == {"owner": owner_id(key)}
    assert key not in reply.text


def test_the_owner_is_left_where_the_facade_reads_it(client: TestClient) -> None:
    """A route that does not ask for the owner still gets it through `owner_of`."""
    assert client.get("/v1/models", headers=bearer(KEY)).json()["owner"] == owner_id(KEY)


def test_owner_ids_are_stable_distinct_and_not_the_key() -> None:
    assert owner_id(KEY) == owner_id(KEY)
    assert owner_id(KEY) != owner_id(OTHER_KEY)
    assert owner_id(KEY).startswith("key_") and KEY not in owner_id(KEY)


@pytest.mark.parametrize(
    "authorization",
    [
        "Bearer sk-test-wrong",
        f"Bearer {KEY[:-1]}",
        f"Bearer {KEY}x",
        f"Basic {KEY}",
        KEY,
        "Bearer ",
        "Bearer",
    ],
)
def test_a_wrong_key_is_an_openai_shaped_401(client: TestClient, authorization: str) -> None:
    reply = client.get("/v1/whoami", headers={"Authorization": authorization})
    assert reply.status_code == 401
    assert reply.json() == INCORRECT
    assert reply.headers["WWW-Authenticate"] == "Bearer"
    assert "sk-test" not in reply.text


def test_a_missing_key_is_a_401_saying_how_to_send_one(client: TestClient) -> None:
    reply = client.get("/v1/models")
    assert reply.status_code == 401
    error = reply.json()["error"]
    assert (error["type"], error["param"], error["code"]) == ("invalid_request_error", None, None)
    assert "Authorization: Bearer" in error["message"]


def test_two_authorization_headers_are_refused(client: TestClient) -> None:
    reply = client.get(
        "/v1/whoami", headers=[("Authorization", f"Bearer {KEY}"), ("Authorization", "Bearer x")]
    )
    assert reply.status_code == 401


def test_scheme_is_case_insensitive_and_spaces_are_trimmed(client: TestClient) -> None:
    reply = client.get("/v1/whoami", headers={"Authorization": f"bearer  {KEY} "})
    assert reply.json() == {"owner": owner_id(KEY)}


def test_healthz_needs_no_key(client: TestClient) -> None:
    assert client.get("/healthz").status_code == 200


def test_without_keys_everyone_is_anonymous() -> None:
    client = TestClient(make_app(ApiKeys()))
    assert client.get("/v1/whoami").json() == {"owner": ANONYMOUS_OWNER}
    assert client.get("/v1/whoami", headers=bearer("anything")).json() == {"owner": ANONYMOUS_OWNER}


def test_an_app_without_installed_keys_fails_closed() -> None:
    client = TestClient(make_app(None), raise_server_exceptions=False)
    reply = client.get("/v1/whoami", headers=bearer(KEY))
    assert reply.status_code == 500
    assert "owner" not in reply.text


def test_every_key_is_compared(monkeypatch: pytest.MonkeyPatch) -> None:
    expected = owner_id(KEY)  # (itself a comparison, made before they are counted)
    compared: list[tuple[bytes, bytes]] = []
    real = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        compared.append((a, b))
        return real(a, b)

    monkeypatch.setattr(secrets.hmac, "compare_digest", counting)
    keys = ApiKeys.from_keys([KEY, OTHER_KEY, "sk-third-key-0000000000"])
    assert keys.owner_for_key(KEY) == expected
    assert len(compared) == 3
    assert all(len(a) == len(b) == 32 for a, b in compared)


def test_keys_from_env_and_file(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text(f"# team keys\n{OTHER_KEY}\n\n", encoding="utf-8")
    keys = FacadeSettings.from_env({API_KEYS_ENV: f" {KEY} ,,", API_KEYS_FILE_ENV: str(key_file)}).api_keys
    assert keys.enabled and len(keys.digests) == 2
    assert keys.owner_for_key(OTHER_KEY) == owner_id(OTHER_KEY)
    assert keys.owner_for_key("sk-nope") is None
    assert not FacadeSettings.from_env({}).api_keys.enabled
    assert KEY not in repr(keys)


def test_an_empty_key_file_is_refused(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text("# to be filled\n", encoding="utf-8")
    with pytest.raises(ValueError, match=API_KEYS_FILE_ENV):
        FacadeSettings.from_env({API_KEYS_FILE_ENV: str(key_file)})


def test_every_facade_route_but_the_probes_needs_a_key(tmp_path: Path) -> None:
    """The real app with keys configured; routes enumerated from its OpenAPI schema, so a route
    added later without the dependency fails here. No engine is needed: auth answers first."""
    settings = FacadeSettings(
        store_path=tmp_path / "store.sqlite3",
        engine_address="127.0.0.1:1",
        api_keys=ApiKeys.from_keys([KEY]),
    )
    app = create_app(settings)
    checked = 0
    with TestClient(app) as client:
        for path, operations in app.openapi()["paths"].items():
            concrete = re.sub(r"\{[^}]+\}", "x_1", path)
            for method in operations:
                reply = client.request(method.upper(), concrete, json={})
                if path == "/healthz":
                    assert reply.status_code == 200, path
                elif path == "/readyz":
                    # Probed without a key; it says only that it is not ready (no engine here).
                    assert reply.status_code == 503, path
                    assert reply.json()["error"] == {
                        "message": "The server is not ready.",
                        "type": "server_error",
                        "code": "not_ready",
                        "param": None,
                    }
                elif path.startswith("/v1/messages"):
                    # Anthropic's routes answer in Anthropic's shape.
                    error = reply.json()
                    assert (reply.status_code, error["error"]["type"]) == (401, "authentication_error")
                    checked += 1
                else:
                    assert (reply.status_code, reply.json()["error"]["code"]) == (401, None), (method, path)
                    checked += 1
        assert "/readyz" in app.openapi()["paths"]
        reply = client.get("/v1/responses/resp_unknown", headers=bearer(KEY))
        assert reply.status_code == 404
        # The schema is behind the key; the browser UIs (which fetch it without one) are off.
        assert client.get("/openapi.json").status_code == 401
        assert client.get("/openapi.json", headers=bearer(KEY)).json()["paths"]
        for ui in ("/docs", "/redoc"):
            assert client.get(ui, headers=bearer(KEY)).status_code == 404
    assert checked >= 12


def test_without_keys_the_schema_and_docs_are_served(tmp_path: Path) -> None:
    settings = FacadeSettings(store_path=tmp_path / "store.sqlite3", engine_address="127.0.0.1:1")
    with TestClient(create_app(settings)) as client:
        assert client.get("/openapi.json").status_code == 200
        assert client.get("/docs").status_code == 200


def test_no_cors_middleware_is_installed(tmp_path: Path) -> None:
    """No CORS at all (so never a wildcard with credentials): browsers get no cross-origin access."""
    settings = FacadeSettings(store_path=tmp_path / "store.sqlite3", engine_address="127.0.0.1:1")
    app = create_app(settings)
    assert all(middleware.cls is not CORSMiddleware for middleware in app.user_middleware)
    with TestClient(app) as client:
        reply = client.get("/healthz", headers={"Origin": "https://evil.example"})
        assert "access-control-allow-origin" not in reply.headers
        preflight = client.options(
            "/v1/responses",
            headers={"Origin": "https://evil.example", "Access-Control-Request-Method": "POST"},
        )
        assert "access-control-allow-origin" not in preflight.headers
