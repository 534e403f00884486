"""Token logprobs on the real stack (engine + facade processes, the trained squares model), with
the openai SDK: Responses `top_logprobs` + include, streamed and not, and chat `logprobs`."""

from __future__ import annotations

import math
import random
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai.types.responses import ResponseTextDeltaEvent

from tests.e2e import squares_requests as squares
from training.squares import QUESTION, draw_sample

MAX_TOKENS = 16
INCLUDE: Any = ["message.output_text.logprobs"]


@pytest.fixture(scope="module")
def sdk(squares_facade_url: str) -> Iterator[openai.OpenAI]:
    client = openai.OpenAI(base_url=f"{squares_facade_url}/v1", api_key="x", max_retries=0, timeout=120)
    yield client
    client.close()


def image_url() -> str:
    return squares.data_url(draw_sample(random.Random(7)))


def check(tokens: list[Any], text: str, top: int) -> None:
    """Greedy decoding: each token is the most likely one; the tokens spell the text."""
    assert tokens and "".join(t.token for t in tokens) == text
    for t in tokens:
        assert t.logprob <= 1e-6 and t.bytes == list(t.token.encode())
        assert 0 < len(t.top_logprobs) <= top
        assert t.logprob == pytest.approx(t.top_logprobs[0].logprob, abs=1e-4)
        assert sum(math.exp(a.logprob) for a in t.top_logprobs) <= 1 + 1e-4


def test_responses_top_logprobs_streamed_and_not(sdk: openai.OpenAI) -> None:
    content: Any = [
        {"type": "input_text", "text": QUESTION},
        {"type": "input_image", "image_url": image_url(), "detail": "auto"},
    ]
    request: dict[str, Any] = {
        "model": "default",
        "input": [{"role": "user", "content": content}],
        "max_output_tokens": MAX_TOKENS,
        "temperature": 0,
        "top_logprobs": 3,
        "include": INCLUDE,
    }
    response = sdk.responses.create(**request)
    (part,) = response.output[-1].content  # type: ignore[union-attr]
    assert part.type == "output_text"
    check(list(part.logprobs or []), response.output_text, 3)

    deltas: list[ResponseTextDeltaEvent] = []
    with sdk.responses.stream(**request) as stream:
        deltas = [event for event in stream if isinstance(event, ResponseTextDeltaEvent)]
        final = stream.get_final_response()
    streamed = [lp for event in deltas for lp in event.logprobs]
    assert final.output_text == response.output_text
    assert [(lp.token, lp.logprob) for lp in streamed] == [
        (lp.token, lp.logprob) for lp in part.logprobs or []
    ]


def test_chat_logprobs_with_top_logprobs(sdk: openai.OpenAI) -> None:
    content: Any = [
        {"type": "text", "text": QUESTION},
        {"type": "image_url", "image_url": {"url": image_url()}},
    ]
    completion = sdk.chat.completions.create(
        model="default",
        messages=[{"role": "user", "content": content}],
        max_tokens=MAX_TOKENS,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    (choice,) = completion.choices
    assert choice.logprobs is not None
    check(list(choice.logprobs.content or []), choice.message.content or "", 2)
