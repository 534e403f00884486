"""What /metrics shows, and to whom (issue 26, findings 6 and 15).

6: the HTTP method was a label taken from the request line: 3,000 made-up methods, sent without
any key, grew /metrics from 49 KB to 11.8 MB and the facade's memory for good. Every label's
values are now bounded (methods: the standard ones, else `other`; paths: route templates, else
`unmatched`).
15: any client key could read every key's traffic counts. With API keys on, /metrics needs an
operator key; no figure there is labelled by owner."""

from __future__ import annotations

from tests._prometheus import metric_samples
from tests.facade.helpers import in_process
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Store, create_app
from vlmserve.facade.http.metrics import bounded_method
from vlmserve.facade.settings.api_keys import ApiKeys

OPERATOR = "sk-operator"


def test_only_standard_methods_are_label_values() -> None:
    cases = {"GET": "GET", "POST": "POST", "DELETE": "DELETE", "OPTIONS": "OPTIONS", "get": "other"}
    cases |= {"FOO123": "other", "X" * 500: "other", "PROPFIND": "other"}
    assert {method: bounded_method(method) for method in cases} == cases


async def test_made_up_methods_and_paths_do_not_grow_the_metrics(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    keyed = settings.replace(
        api_keys=ApiKeys.from_keys(["sk-a"]), operator_keys=ApiKeys.from_keys([OPERATOR])
    )
    app = create_app(keyed, engine=engine_client, store=store)
    async with in_process(app) as http:

        async def scrape() -> str:
            reply = await http.get("/metrics", headers={"authorization": f"Bearer {OPERATOR}"})
            assert reply.status_code == 200
            return reply.text

        for index in range(10):  # the series these make, and the scrape's own, exist from here
            await http.request(f"WARM{index}", f"/v1/w{index}")
            await scrape()
        before = await scrape()
        # No key at all, each with a method and a path of its own (404s, unrouted).
        for index in range(1, 1000):
            await http.request(f"BREW{index}", f"/v1/x{index}")
        await scrape()
        after = await scrape()
        assert "BREW" not in after and "WARM" not in after and "/v1/x" not in after
        samples = metric_samples(after)
        prefix = 'vlmserve_facade_http_requests_total{method="other",route="unmatched",'
        assert sum(value for name, value in samples.items() if name.startswith(prefix)) == 1009
        # The same series, only their numbers moved (a few more digits), not one per request.
        assert len(after) - len(before) < 300, (len(before), len(after))


async def test_metrics_are_the_operators_and_carry_no_owner(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    keys = ApiKeys.from_keys(["sk-a", "sk-b"])
    app = create_app(
        settings.replace(api_keys=keys, operator_keys=ApiKeys.from_keys([OPERATOR])),
        engine=engine_client,
        store=store,
    )
    async with in_process(app) as http:
        assert (
            await http.post("/v1/responses", json={"input": "hi"}, headers={"authorization": "Bearer sk-a"})
        ).status_code == 200
        refused = await http.get("/metrics", headers={"authorization": "Bearer sk-b"})
        assert refused.status_code == 403
        assert refused.json()["error"]["code"] == "permission_denied"
        assert (await http.get("/metrics")).status_code == 401
        assert (await http.get("/metrics", headers={"authorization": "Bearer sk-wrong"})).status_code == 401
        # The operator key is not a client key: it cannot create responses.
        assert (
            await http.post(
                "/v1/responses", json={"input": "hi"}, headers={"authorization": f"Bearer {OPERATOR}"}
            )
        ).status_code == 401
        scraped = await http.get("/metrics", headers={"authorization": f"Bearer {OPERATOR}"})
        assert scraped.status_code == 200
        assert "key_" not in scraped.text and "owner" not in scraped.text
    # API keys on and no operator key configured: closed to every client key.
    closed = create_app(settings.replace(api_keys=keys), engine=engine_client, store=store)
    async with in_process(closed) as http:
        assert (await http.get("/metrics", headers={"authorization": "Bearer sk-a"})).status_code == 403
    # Keys off (a local server): open, as before.
    open_app = create_app(settings, engine=engine_client, store=store)
    async with in_process(open_app) as http:
        assert (await http.get("/metrics")).status_code == 200
