"""The body budget against starvation (issue 26, finding 4): a connection that declares a large
Content-Length and trickles its body held the whole bodies-in-flight budget, and another key's
requests got 503 for as long as it liked. Bytes are now held as they arrive, each key holds at
most its share, and a body slower than the minimum rate is cut off with a 408. Through uvicorn
as the CLI configures it, on loopback."""

from __future__ import annotations

import asyncio
import json
import time

import httpx

from tests.facade.helpers import owner_id
from tests.hardening.test_slow_clients import read_all, serving, wait_for
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Limits, Store, create_app
from vlmserve.facade.http.body_budget import BodyBudget
from vlmserve.facade.settings.api_keys import ApiKeys

KEY_A, KEY_B = "sk-attacker", "sk-victim"


def keyed(settings: FacadeSettings, limits: Limits) -> FacadeSettings:
    return settings.replace(limits=limits, api_keys=ApiKeys.from_keys([KEY_A, KEY_B]))


def head(port: int, key: str, length: int) -> bytes:
    return (
        f"POST /v1/responses HTTP/1.1\r\nhost: t\r\nauthorization: Bearer {key}\r\n"
        f"content-type: application/json\r\ncontent-length: {length}\r\n\r\n"
    ).encode()


async def test_a_declared_length_trickled_holds_nothing_and_is_cut_at_the_minimum_rate(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    limits = Limits(
        max_request_bytes=64 * 1024,
        max_body_bytes_in_flight=64 * 1024,
        min_body_bytes_per_s=1024,
        body_rate_grace_s=1.0,
    )
    keyed_settings = keyed(settings, limits)
    app = create_app(keyed_settings, engine=engine_client, store=store)
    budget: BodyBudget = app.state.facade.body_budget
    async with (
        serving(app, keyed_settings) as port,
        httpx.AsyncClient(
            base_url=f"http://127.0.0.1:{port}", headers={"authorization": f"Bearer {KEY_B}"}
        ) as victim,
    ):
        # The attack: the whole budget declared, one byte a second.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head(port, KEY_A, 64 * 1024) + b"{")
        started = time.monotonic()
        answer = asyncio.ensure_future(read_all(reader, 15))
        await wait_for(lambda: budget.in_flight == 1)
        # Meanwhile the other key is served: what is held is what arrived, one byte.
        body = json.dumps({"input": "x" * 30_000}).encode()
        replies = [await victim.post("/v1/responses", content=body) for _ in range(10)]
        assert [reply.status_code for reply in replies] == [200] * 10
        while not answer.done() and time.monotonic() - started < 12:
            writer.write(b" ")
            await asyncio.wait({answer}, timeout=1.0)
        reply = await answer
        took = time.monotonic() - started
        writer.close()
        status, _, rest = reply.partition(b"\r\n")
        assert status == b"HTTP/1.1 408 Request Timeout", reply[:200]
        error = json.loads(rest.partition(b"\r\n\r\n")[2])["error"]
        assert error["code"] == "request_timeout" and "slower than 1024 bytes per second" in error["message"]
        # Cut after the 1 s grace (and the few bytes' allowance), not at the 60 s body timeout.
        assert 0.9 < took < 8, took
        await wait_for(lambda: budget.in_flight == 0)


async def test_one_key_holds_at_most_its_share_of_the_bodies_in_flight(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    limits = Limits(
        max_request_bytes=40_000, max_body_bytes_in_flight=100_000, max_body_bytes_in_flight_per_key=50_000
    )
    keyed_settings = keyed(settings, limits)
    app = create_app(keyed_settings, engine=engine_client, store=store)
    budget: BodyBudget = app.state.facade.body_budget
    a_headers = {"authorization": f"Bearer {KEY_A}", "content-type": "application/json"}
    body = json.dumps({"input": "x" * 30_000}).encode()
    async with (
        serving(app, keyed_settings) as port,
        httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as http,
    ):
        # Key A sends 30,000 real bytes of a 40,000-byte body, and stops (held: they arrived).
        _reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(head(port, KEY_A, 40_000) + b" " * 30_000)
        await writer.drain()
        await wait_for(lambda: budget.in_flight == 30_000)
        assert budget.by_owner == {owner_id(KEY_A): 30_000}
        # Another of A's bodies passes A's share (50,000) while it is read: 503, at once.
        refused = await http.post("/v1/responses", content=body, headers=a_headers)
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["code"] == "server_busy"
        assert "This API key" in refused.json()["error"]["message"]
        # Key B still has the rest of the budget.
        for _ in range(3):
            served = await http.post(
                "/v1/responses", content=body, headers={**a_headers, "authorization": f"Bearer {KEY_B}"}
            )
            assert served.status_code == 200, served.text
        writer.close()
        await wait_for(lambda: budget.in_flight == 0)
        assert budget.by_owner == {}
        assert (await http.post("/v1/responses", content=body, headers=a_headers)).status_code == 200
        assert budget.peak <= 100_000


def test_the_share_per_key_defaults_to_half_the_budget_and_needs_keys(settings: FacadeSettings) -> None:
    limits = Limits(max_request_bytes=10, max_body_bytes_in_flight=100)
    assert settings.replace(limits=limits).body_bytes_per_key() is None
    assert keyed(settings, limits).body_bytes_per_key() == 50
    # Never below one largest body.
    large = Limits(max_request_bytes=80, max_body_bytes_in_flight=100)
    assert keyed(settings, large).body_bytes_per_key() == 80
