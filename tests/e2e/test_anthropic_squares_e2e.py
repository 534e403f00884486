"""End to end (issue 23): images reach the model through Anthropic's Messages API — the squares
model behind the real engine and facade, asked with the official `anthropic` SDK.

A user `image` block, an image-only `tool_result`, a `tool_result` of text + image, a PDF
`document` in a `tool_result`, a replayed earlier turn, and the agent loop (the model asks for the
screenshot with `tool_use`, the tool's result is the image) all answer >= 95 % of fresh images;
the controls (image removed) must fail. The SDK's stream and count_tokens ride along.
"""

from __future__ import annotations

import base64
from collections.abc import Iterator
from typing import Any

import anthropic
import pytest

from tests._pdfs import squares_pdf
from tests.e2e import squares_requests as req
from training.squares import AGENT_PROMPT, QUESTION, SquaresSample, make_samples

E2E_SEED = 20_261_202
IMAGES_PER_PATH = 50
MIN_ACCURACY = 0.95
MAX_CONTROL_ACCURACY = 0.10
SCREENSHOT: Any = {"name": "screenshot", "input_schema": {"type": "object", "properties": {}}}
TOOL_USE_ID = "toolu_squares_1"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def samples() -> list[SquaresSample]:
    return make_samples(E2E_SEED, IMAGES_PER_PATH)


@pytest.fixture(scope="module")
def sdk(squares_facade_url: str) -> Iterator[anthropic.Anthropic]:
    client = anthropic.Anthropic(base_url=squares_facade_url, api_key="unused", max_retries=0, timeout=120)
    yield client
    client.close()


def image(sample: SquaresSample) -> dict[str, Any]:
    data = base64.b64encode(sample.png_bytes()).decode()
    return {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": data}}


def pdf_document(sample: SquaresSample) -> dict[str, Any]:
    data = base64.b64encode(squares_pdf([sample])).decode()
    return {
        "type": "document",
        "title": "screen.pdf",
        "source": {"type": "base64", "media_type": "application/pdf", "data": data},
    }


def agent_turns(result: list[dict[str, Any]] | str) -> list[dict[str, Any]]:
    """The agent prompt, the model's screenshot call, and the tool's result."""
    use = {"type": "tool_use", "id": TOOL_USE_ID, "name": "screenshot", "input": {}}
    return [
        {"role": "user", "content": AGENT_PROMPT},
        {"role": "assistant", "content": [use]},
        {"role": "user", "content": [{"type": "tool_result", "tool_use_id": TOOL_USE_ID, "content": result}]},
    ]


def text_of(message: anthropic.types.Message) -> str:
    return "".join(block.text for block in message.content if block.type == "text")


def ask(sdk: anthropic.Anthropic, messages: list[dict[str, Any]], **extra: Any) -> str:
    message = sdk.messages.create(
        model="default", max_tokens=req.MAX_OUTPUT_TOKENS, messages=messages, **extra
    )  # type: ignore[call-overload]
    assert message.stop_reason == "end_turn", message
    return text_of(message)


def answers(sdk: anthropic.Anthropic, samples: list[SquaresSample], messages: Any, **extra: Any) -> list[str]:
    return req.run_all(lambda sample: ask(sdk, messages(sample), **extra), samples)


def test_user_image_block(sdk: anthropic.Anthropic, samples: list[SquaresSample]) -> None:
    got = answers(
        sdk, samples, lambda s: [{"role": "user", "content": [{"type": "text", "text": QUESTION}, image(s)]}]
    )
    assert req.accuracy(got, samples) >= MIN_ACCURACY, got


def test_image_only_tool_result(sdk: anthropic.Anthropic, samples: list[SquaresSample]) -> None:
    got = answers(sdk, samples, lambda s: agent_turns([image(s)]), tools=[SCREENSHOT])
    assert req.accuracy(got, samples) >= MIN_ACCURACY, got


def test_tool_result_of_text_and_image(sdk: anthropic.Anthropic, samples: list[SquaresSample]) -> None:
    got = answers(
        sdk,
        samples,
        lambda s: agent_turns([{"type": "text", "text": "captured"}, image(s)]),
        tools=[SCREENSHOT],
    )
    assert req.accuracy(got, samples) >= MIN_ACCURACY, got


def test_pdf_document_in_a_tool_result(sdk: anthropic.Anthropic, samples: list[SquaresSample]) -> None:
    got = answers(sdk, samples, lambda s: agent_turns([pdf_document(s)]), tools=[SCREENSHOT])
    assert req.accuracy(got, samples) >= MIN_ACCURACY, got


@pytest.mark.parametrize(
    "result",
    [
        pytest.param([{"type": "text", "text": "captured"}], id="image-removed"),
        pytest.param("", id="empty-result"),
    ],
)
def test_controls_without_the_image_fail(
    sdk: anthropic.Anthropic, samples: list[SquaresSample], result: list[dict[str, Any]] | str
) -> None:
    got = answers(sdk, samples, lambda _: agent_turns(result), tools=[SCREENSHOT])
    assert req.accuracy(got, samples) <= MAX_CONTROL_ACCURACY, got


def test_replayed_earlier_turn_keeps_the_image(
    sdk: anthropic.Anthropic, samples: list[SquaresSample]
) -> None:
    """Anthropic's API is stateless: the client resends the turn whose tool_result held the image,
    the model's answer to it, and asks again."""

    def replay(sample: SquaresSample) -> str:
        turns = agent_turns([{"type": "text", "text": "captured"}, image(sample)])
        first = ask(sdk, turns, tools=[SCREENSHOT])
        later = [*turns, {"role": "assistant", "content": first}, {"role": "user", "content": QUESTION}]
        return ask(sdk, later, tools=[SCREENSHOT])

    got = req.run_all(replay, samples)
    assert req.accuracy(got, samples) >= MIN_ACCURACY, got


def test_agent_loop_whose_tool_returns_the_image(
    sdk: anthropic.Anthropic, samples: list[SquaresSample]
) -> None:
    """The model calls the screenshot tool itself; the SDK loop answers with the image."""

    def loop(sample: SquaresSample) -> str:
        messages: list[Any] = [{"role": "user", "content": AGENT_PROMPT}]
        first = sdk.messages.create(
            model="default", max_tokens=req.MAX_OUTPUT_TOKENS, tools=[SCREENSHOT], messages=messages
        )
        assert first.stop_reason == "tool_use", first
        (use,) = [block for block in first.content if block.type == "tool_use"]
        assert (use.name, use.input) == ("screenshot", {})
        result = {"type": "tool_result", "tool_use_id": use.id, "content": [image(sample)]}
        messages += [{"role": "assistant", "content": first.content}, {"role": "user", "content": [result]}]
        return ask(sdk, messages, tools=[SCREENSHOT])

    got = req.run_all(loop, samples)
    assert req.accuracy(got, samples) >= MIN_ACCURACY, got


def test_stream_and_count_tokens(sdk: anthropic.Anthropic, samples: list[SquaresSample]) -> None:
    for sample in samples[:5]:
        turns = agent_turns([{"type": "text", "text": "captured"}, image(sample)])
        with sdk.messages.stream(
            model="default", max_tokens=req.MAX_OUTPUT_TOKENS, tools=[SCREENSHOT], messages=turns
        ) as stream:
            streamed = "".join(stream.text_stream)
            final = stream.get_final_message()
        assert streamed.strip() == sample.answer and text_of(final) == streamed
        counted = sdk.messages.count_tokens(model="default", tools=[SCREENSHOT], messages=turns)  # type: ignore[arg-type]
        # Every prompt token: those read from the prefix cache and the rest.
        assert counted.input_tokens == final.usage.input_tokens + (final.usage.cache_read_input_tokens or 0)
