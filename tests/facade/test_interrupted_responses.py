"""Start-up marks responses a previous facade process left `in_progress` (it died mid-generation)
as `failed`, for every owner: nothing will ever finish them."""

from __future__ import annotations

from typing import Any

from tests.facade.both_stores import on_both_store_backends  # noqa: F401
from tests.facade.helpers import assert_valid, in_process
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Store, create_app
from vlmserve.facade.app import INTERRUPTED_ERROR
from vlmserve.facade.http.api_keys import ANONYMOUS_OWNER
from vlmserve.facade.store.records import ResponseRecord

OTHER_OWNER = "someone-else"


def left_in_progress(finished: dict[str, Any], response_id: str) -> dict[str, Any]:
    """A response as the facade stores it when its generation starts."""
    return {
        **finished,
        "id": response_id,
        "status": "in_progress",
        "completed_at": None,
        "output": [],
        "usage": None,
    }


async def test_start_up_fails_responses_left_in_progress(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    first = create_app(settings, engine=engine_client, store=store)
    async with in_process(first) as http:
        finished = (await http.post("/v1/responses", json={"model": "default", "input": "hi"})).json()
    assert finished["status"] == "completed"
    # What a facade killed mid-generation leaves behind, for two owners.
    interrupted = left_in_progress(finished, "resp_interrupted")
    await store.responses.put(ResponseRecord.of(interrupted), [], owner=ANONYMOUS_OWNER)
    await store.responses.put(
        ResponseRecord.of(left_in_progress(finished, "resp_other")), [], owner=OTHER_OWNER
    )

    restarted = create_app(settings, engine=engine_client, store=store)
    async with (
        restarted.router.lifespan_context(restarted),
        in_process(restarted) as http,
    ):
        stored = (await http.get("/v1/responses/resp_interrupted")).json()
        assert stored["error"] == {
            "code": "server_error",
            "message": "The server restarted before this response finished.",
        }
        assert stored == {**interrupted, "status": "failed", "error": INTERRUPTED_ERROR}
        assert_valid(stored, "ResponseResource")
        # Finished responses are left alone; a failed one cannot be cancelled.
        assert (await http.get(f"/v1/responses/{finished['id']}")).json() == finished
        refused = await http.post("/v1/responses/resp_interrupted/cancel")
        assert (refused.status_code, refused.json()["error"]["code"]) == (400, "response_not_cancellable")
    other = await store.responses.get("resp_other", owner=OTHER_OWNER)
    assert other is not None and (other.status, other.resource["error"]) == ("failed", INTERRUPTED_ERROR)
