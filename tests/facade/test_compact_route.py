"""`POST /v1/responses/compact` on the wire (the model faked: the route's own shapes are what is
tested here; tests/e2e/test_compaction_real_stack.py runs a real model)."""

from __future__ import annotations

import httpx

from tests.facade.fake_engine import FakeEngine


async def test_kept_messages_carry_annotations_like_responses(
    http: httpx.AsyncClient, engine: FakeEngine
) -> None:
    reply = await http.post(
        "/v1/responses/compact",
        json={
            "model": "default",
            "input": [
                {"role": "user", "content": "old question"},
                {"role": "assistant", "content": "old answer"},
                {"role": "user", "content": "the last question"},
                {"role": "assistant", "content": [{"type": "output_text", "text": "its answer"}]},
                {"role": "assistant", "content": "more"},
            ],
        },
    )
    assert reply.status_code == 200, reply.text
    output = reply.json()["output"]
    assert [item["type"] for item in output] == ["compaction", "message", "message", "message"]
    assert output[1]["content"] == [{"type": "input_text", "text": "the last question"}]
    # Output text parts as /v1/responses writes them.
    for item in output[2:]:
        (part,) = item["content"]
        assert part["type"] == "output_text" and part["annotations"] == [] and part["logprobs"] == []
    assert output[2]["content"][0]["text"] == "its answer"
    assert output[3]["content"][0]["text"] == "more"
    # The same part shape a created response's message has.
    created = (await http.post("/v1/responses", json={"model": "default", "input": "hi"})).json()
    assert set(created["output"][0]["content"][0]) == set(output[2]["content"][0])
