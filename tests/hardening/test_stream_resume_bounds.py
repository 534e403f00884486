"""A background stream resumed with `starting_after` >= 2**63 was a 200 whose stream was then cut
(the store's 64-bit integer overflowed; issue 26, finding 7): now a 400 naming it, before
anything is streamed."""

from __future__ import annotations

import httpx

from tests.facade.helpers import in_process
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Store, create_app


async def test_a_resume_point_past_64_bits_is_a_400_naming_it(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    app = create_app(settings, engine=engine_client, store=store)
    async with in_process(app) as http:
        await _resume_past_64_bits(http)


async def _resume_past_64_bits(http: httpx.AsyncClient) -> None:
    created = await http.post("/v1/responses", json={"input": "hi", "background": True})
    response_id = created.json()["id"]
    for value in (2**63, 2**64 + 5, 10**30):
        reply = await http.get(
            f"/v1/responses/{response_id}", params={"stream": "true", "starting_after": value}
        )
        assert reply.status_code == 400, (value, reply.text[:200])
        assert reply.headers["content-type"].startswith("application/json")
        assert reply.json()["error"]["param"] == "starting_after"
    # The largest the store can compare is fine: nothing after it, the stream ends cleanly.
    reply = await http.get(
        f"/v1/responses/{response_id}", params={"stream": "true", "starting_after": 2**63 - 1}
    )
    assert reply.status_code == 200
    assert reply.text.rstrip().endswith("data: [DONE]")
