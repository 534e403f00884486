"""Every HTTP answer names its request (`x-request-id`), and log lines written while serving it
carry that id and the response id (facade/http/request_ids.py, vlmserve.server.logs)."""

from __future__ import annotations

import logging

import httpx
import pytest

from vlmserve.server.logs import ContextIds


async def test_every_answer_has_its_own_request_id(http: httpx.AsyncClient) -> None:
    first = await http.post("/v1/responses", json={"model": "default", "input": "hi"})
    second = await http.get("/v1/responses/resp_missing")
    refused = await http.post("/v1/responses", json={"model": "default"})
    ids = [answer.headers["x-request-id"] for answer in (first, second, refused)]
    assert (first.status_code, second.status_code, refused.status_code) == (200, 404, 400)
    assert all(value.startswith("req_") for value in ids)
    assert len(set(ids)) == 3


async def test_anthropic_answers_carry_request_id_too(http: httpx.AsyncClient) -> None:
    """Anthropic names the header `request-id` (the anthropic SDK's `_request_id` reads it)."""
    body = {"model": "default", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    answered = await http.post("/v1/messages", json=body)
    streamed = await http.post("/v1/messages", json={**body, "stream": True})
    refused = await http.post("/v1/messages", json={"model": "default"})
    counted = await http.post(
        "/v1/messages/count_tokens", json={"model": "default", "messages": body["messages"]}
    )
    listed = await http.get("/v1/models", headers={"anthropic-version": "2023-06-01"})
    for answer in (answered, streamed, refused, counted, listed):
        assert answer.headers.get_list("request-id") == [answer.headers["x-request-id"]], answer.headers
        assert answer.headers["request-id"].startswith("req_")
    assert (answered.status_code, streamed.status_code, refused.status_code) == (200, 200, 400)
    # An OpenAI client's answer has only OpenAI's name.
    openai_answer = await http.post("/v1/responses", json={"model": "default", "input": "hi"})
    assert "request-id" not in openai_answer.headers


async def test_a_clients_request_id_is_not_taken_into_the_logs(http: httpx.AsyncClient) -> None:
    answer = await http.post(
        "/v1/responses", json={"model": "default", "input": "hi"}, headers={"x-request-id": "forged\nline"}
    )
    assert answer.headers.get_list("x-request-id") == [answer.headers["x-request-id"]]
    assert answer.headers["x-request-id"].startswith("req_")


async def test_log_lines_of_a_response_carry_both_ids(
    http: httpx.AsyncClient, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.handler.addFilter(ContextIds())
    caplog.set_level(logging.INFO, logger="vlmserve.facade")
    # A hosted tool is left out of the prompt, and the facade logs that for the response.
    answer = await http.post(
        "/v1/responses", json={"model": "default", "input": "hi", "tools": [{"type": "web_search"}]}
    )
    assert answer.status_code == 200
    lines = [record for record in caplog.records if "hosted tools" in record.getMessage()]
    assert lines, caplog.text
    assert getattr(lines[0], "request_id", None) == answer.headers["x-request-id"]
    assert getattr(lines[0], "response_id", None) == answer.json()["id"]
