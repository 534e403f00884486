"""Bounds on what a request may carry, checked where it is parsed, and what a failure after
admission releases (issue 39, the facade's findings): a failure after admission released
nothing (Anthropic `top_k` 2^63 passed validation and was a 500 after the response was admitted:
32 such requests locked the key out, each kept its request in memory), and numbers no field
bounded where it was parsed."""

from __future__ import annotations

import gc
import json
import logging
from typing import Any

import pytest

from tests.facade.helpers import in_process
from vlmserve.client import AsyncEngineClient
from vlmserve.facade import FacadeSettings, Limits, Store, create_app
from vlmserve.facade.http.errors import APIError
from vlmserve.facade.responses.running import Generation
from vlmserve.facade.settings.api_keys import ApiKeys

KEY = "sk-round4"
HEADERS = {"authorization": f"Bearer {KEY}", "x-api-key": KEY}
HUGE = 2**63


@pytest.fixture
def keyed(settings: FacadeSettings) -> FacadeSettings:
    return settings.replace(api_keys=ApiKeys.from_keys([KEY]), limits=Limits(max_responses_per_key=2))


def _messages(**extra: Any) -> dict[str, Any]:
    return {"model": "default", "max_tokens": 16, "messages": [{"role": "user", "content": "hi"}], **extra}


# Every numeric field of every API, at 2^63 (and where a float, 1e400 = inf): a 400 naming it.
NUMERIC_FIELDS: list[tuple[str, dict[str, Any], str]] = [
    ("/v1/messages", _messages(top_k=HUGE), "top_k"),
    ("/v1/messages/count_tokens", _messages(top_k=HUGE), "top_k"),
    ("/v1/messages", _messages(max_tokens=HUGE), "max_tokens"),
    (
        "/v1/messages",
        _messages(max_tokens=HUGE, thinking={"type": "enabled", "budget_tokens": HUGE}),
        "max_tokens",
    ),
    (
        "/v1/messages",
        _messages(thinking={"type": "enabled", "budget_tokens": HUGE}),
        "thinking.budget_tokens",
    ),
    ("/v1/messages", _messages(temperature=HUGE), "temperature"),
    ("/v1/messages", _messages(top_p=HUGE), "top_p"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_tokens": HUGE},
        "max_tokens",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": HUGE},
        "max_completion_tokens",
    ),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "seed": 2**64}, "seed"),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "n": HUGE}, "n"),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "top_logprobs": HUGE},
        "top_logprobs",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "presence_penalty": HUGE},
        "presence_penalty",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "frequency_penalty": HUGE},
        "frequency_penalty",
    ),
    (
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi"}], "temperature": HUGE},
        "temperature",
    ),
    ("/v1/responses", {"input": "hi", "max_output_tokens": HUGE}, "max_output_tokens"),
    ("/v1/responses", {"input": "hi", "max_tool_calls": HUGE}, "max_tool_calls"),
    ("/v1/responses", {"input": "hi", "top_logprobs": HUGE}, "top_logprobs"),
    ("/v1/responses", {"input": "hi", "presence_penalty": HUGE}, "presence_penalty"),
    ("/v1/responses", {"input": "hi", "top_p": HUGE}, "top_p"),
    ("/v1/responses/input_tokens", {"input": "hi", "max_output_tokens": HUGE}, "max_output_tokens"),
]


@pytest.mark.parametrize(
    ("path", "body", "param"), NUMERIC_FIELDS, ids=[f"{p}:{f}" for p, _, f in NUMERIC_FIELDS]
)
async def test_every_numeric_field_is_bounded_where_it_is_parsed(
    keyed: FacadeSettings,
    engine_client: AsyncEngineClient,
    store: Store,
    path: str,
    body: dict[str, Any],
    param: str,
) -> None:
    app = create_app(keyed, engine=engine_client, store=store)
    async with in_process(app) as http:
        reply = await http.post(path, json=body, headers=HEADERS)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    named = error.get("param") if "param" in error else error["message"]
    assert param in named, reply.text


def _fail(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("a failure after admission")


# Where a request can fail once its response is admitted: (route, what fails, body).
AFTER_ADMISSION = [
    ("/v1/messages", "vlmserve.facade.routes.anthropic.EventWriter", _messages()),
    ("/v1/messages", "vlmserve.facade.routes.anthropic.Wire", {**_messages(), "stream": True}),
    (
        "/v1/chat/completions",
        "vlmserve.facade.routes.chat.ChunkWriter",
        {"messages": [{"role": "user", "content": "hi"}]},
    ),
    (
        "/v1/responses",
        "vlmserve.facade.routes.responses.ignored_tools_header",
        {"input": "hi", "stream": True},
    ),
    (
        "/v1/responses",
        "vlmserve.facade.routes.responses.ignored_tools_header",
        {"input": "hi", "background": True},
    ),
]


@pytest.mark.parametrize(
    ("path", "target", "body"), AFTER_ADMISSION, ids=[t.rsplit(".", 1)[1] for _, t, _ in AFTER_ADMISSION]
)
async def test_failing_requests_after_admission_do_not_lock_the_key_out(
    keyed: FacadeSettings,
    engine_client: AsyncEngineClient,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    target: str,
    body: dict[str, Any],
) -> None:
    """Whatever fails once a response is admitted releases the key's place and the response
    (one place: the request's unclaimed generations are abandoned when it ends): no 429
    afterwards, nothing kept in memory. Before: each kept its place and its request."""
    # What exists now is set aside from the collector (and from get_objects, below): the check
    # walks only what this test made, not a whole xdist worker's heap (seconds a walk).
    gc.freeze()
    try:
        await _requests_fail_and_leave_nothing(keyed, engine_client, store, monkeypatch, path, target, body)
    finally:
        gc.unfreeze()


async def _requests_fail_and_leave_nothing(
    keyed: FacadeSettings,
    engine_client: AsyncEngineClient,
    store: Store,
    monkeypatch: pytest.MonkeyPatch,
    path: str,
    target: str,
    body: dict[str, Any],
) -> None:
    app = create_app(keyed, engine=engine_client, store=store)
    service = app.state.facade.responses
    budget = app.state.facade.body_budget
    async with in_process(app, raise_app_exceptions=False) as http:
        with monkeypatch.context() as patched:
            patched.setattr(target, _fail)
            # Each 500's log record would hold its traceback (and so the route's frame) in the
            # test's log capture; a server's log handlers write it and let it go.
            patched.setattr(logging.getLogger("vlmserve.facade"), "disabled", True)
            for _ in range(5):
                reply = await http.post(path, json=body, headers=HEADERS)
                assert reply.status_code == 500
        assert service.running == {}
        assert service.admission.active == {}
        assert service.slots.in_use == 0
        assert budget.in_flight == 0
        gc.collect()
        # Nothing of them is kept: no generation of this app is alive (with its request, its texts).
        # By type(o), not isinstance: isinstance reads `__class__`, which on a lazy proxy imports
        # what it stands for.
        alive = [
            o for o in gc.get_objects() if issubclass(type(o), Generation) and o.call.slots is service.slots
        ]
        assert alive == []
        for _ in range(3):
            reply = await http.post(
                path, json={**body, "background": False} if path == "/v1/responses" else body, headers=HEADERS
            )
            assert reply.status_code == 200, reply.text


# ---- many tiny parts (finding 2) ---------------------------------------------------------------


def _tiny_parts(path: str, parts: int) -> tuple[dict[str, Any], str]:
    """A body of `parts` one-character text parts in one user message, and the array it names."""
    kind = "input_text" if path.startswith("/v1/responses") else "text"
    message = {"role": "user", "content": [{"type": kind, "text": "a"}] * parts}
    if path.startswith("/v1/responses"):
        return {"input": [message]}, "input[0].content"
    return {"model": "default", "max_tokens": 4, "messages": [message]}, "messages[0].content"


PARTS_ROUTES = [
    "/v1/messages",
    "/v1/messages/count_tokens",
    "/v1/chat/completions",
    "/v1/responses",
    "/v1/responses/input_tokens",
]


@pytest.mark.parametrize("path", PARTS_ROUTES)
async def test_parts_per_request_are_bounded_before_translating(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store, path: str
) -> None:
    limited = settings.replace(limits=Limits(max_request_parts=50))
    app = create_app(limited, engine=engine_client, store=store)
    async with in_process(app) as http:
        body, where = _tiny_parts(path, 49)  # + the message: 50
        assert (await http.post(path, json=body)).status_code == 200
        body, where = _tiny_parts(path, 50)
        reply = await http.post(path, json=body)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert where in error["message"]
    assert "at most 50 messages, items, content parts and blocks" in error["message"]
    if path.startswith("/v1/responses") or path.startswith("/v1/chat"):
        assert (error["param"], error["code"]) == (where, "too_many_parts")


async def test_objects_past_the_bound_are_refused_and_dropped_while_parsing(
    settings: FacadeSettings, engine_client: AsyncEngineClient, store: Store
) -> None:
    """Objects outside arrays count too (a 400 without a field to name); past the bound a part
    is dropped as it is parsed, so the walk that names the array never holds them all."""
    from vlmserve.facade.http import request_body

    bounds = request_body.JsonBounds(max_objects=10, max_parts=1_000_000)
    nested: dict[str, Any] = {}
    for _ in range(20):
        nested = {"a": nested}
    with pytest.raises(APIError) as refused:
        request_body.parse_text(
            json.dumps({"input": "hi", "metadata": nested}), check_strings=False, bounds=bounds
        )
    assert refused.value.status == 400 and refused.value.code == "request_too_complex"
    # 1,000 parts under a bound of 10 objects: the parts bound names the array, and at most 10 of
    # the parts were ever kept (the rest are one shared stand-in).
    seen: list[Any] = []
    real_check = request_body._check_structure

    def spying(value: Any, **kwargs: Any) -> None:
        seen.append(value)
        real_check(value, **kwargs)

    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(request_body, "_check_structure", spying)
        body = json.dumps(
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": "a"}] * 1000}]}
        )
        with pytest.raises(APIError) as refused:
            request_body.parse_text(body, check_strings=False, bounds=request_body.JsonBounds(10, 100))
    assert (refused.value.param, refused.value.code) == ("input[0].content", "too_many_parts")
    content = seen[0]["input"][0]["content"]
    assert len(content) == 1000 and sum(isinstance(part, dict) for part in content) == 10
