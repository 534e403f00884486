"""One rule finds a name, wherever it is given (issue 39, finding 8): `GET /v1/models/tiny%0A`
answered 200 (Starlette's route pattern ends in `$`, which matches before a final newline, so the
route saw `tiny`) where a body naming `tiny\\n` was a 404."""

from __future__ import annotations

from urllib.parse import quote

import httpx
import pytest

from tests.facade.fake_engine import MODEL_ID


@pytest.mark.parametrize("suffix", ["", "\n", "\r", "\t", "\x00", "\r\n"])
@pytest.mark.parametrize("name", [MODEL_ID, "default"])
async def test_a_model_name_is_found_alike_in_a_path_and_in_a_body(
    http: httpx.AsyncClient, name: str, suffix: str
) -> None:
    given = name + suffix
    retrieved = await http.get("/v1/models/" + quote(given, safe="/"))
    created = await http.post("/v1/responses", json={"model": given, "input": "hi"})
    chat = await http.post(
        "/v1/chat/completions", json={"model": given, "messages": [{"role": "user", "content": "hi"}]}
    )
    expected = 200 if not suffix else 404
    assert (retrieved.status_code, created.status_code, chat.status_code) == (expected,) * 3
    if suffix:
        assert retrieved.json()["error"]["code"] in ("not_found", "model_not_found")


async def test_stored_ids_with_a_control_character_are_not_found(http: httpx.AsyncClient) -> None:
    created = (await http.post("/v1/responses", json={"input": "hi", "store": True})).json()
    assert (await http.get(f"/v1/responses/{created['id']}")).status_code == 200
    assert (await http.get(f"/v1/responses/{created['id']}%0A")).status_code == 404
