"""Responses API request bodies for the squares proof, and reading the answers back."""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

import httpx

from training.squares import AGENT_PROMPT, QUESTION, SquaresSample

# The seed-000 tool, exactly as the seed's request declares it.
SCREENSHOT_TOOL: dict[str, Any] = {
    "type": "function",
    "name": "screenshot",
    "parameters": {"type": "object", "properties": {}},
}
CALL_ID = "call_squares_1"
# The agent loop's first request: a plain string input, as most clients send it.
AGENT_PROMPT_INPUT = AGENT_PROMPT
MAX_OUTPUT_TOKENS = 32
# Requests in flight at once: the engine interleaves them; more would only queue.
WORKERS = 4

T = TypeVar("T")
R = TypeVar("R")


def data_url(sample: SquaresSample) -> str:
    return "data:image/png;base64," + base64.b64encode(sample.png_bytes()).decode("ascii")


def input_image(sample: SquaresSample, detail: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"type": "input_image", "image_url": data_url(sample)}
    if detail is not None:
        part["detail"] = detail
    return part


def user_image_input(sample: SquaresSample) -> list[dict[str, Any]]:
    return [
        {
            "type": "message",
            "role": "user",
            "content": [{"type": "input_text", "text": QUESTION}, input_image(sample)],
        }
    ]


def agent_input(output: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Seed 000's request: the prompt, the model's screenshot call, and the tool's output."""
    return [
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": AGENT_PROMPT}]},
        {"type": "function_call", "call_id": CALL_ID, "name": "screenshot", "arguments": "{}"},
        {"type": "function_call_output", "call_id": CALL_ID, "output": output},
    ]


def captured_with_image(sample: SquaresSample) -> list[dict[str, Any]]:
    return [{"type": "input_text", "text": "captured"}, input_image(sample)]


def image_only(sample: SquaresSample) -> list[dict[str, Any]]:
    """Seed 003's shape (Codex's view_image): one image, detail high, no text."""
    return [input_image(sample, detail="high")]


def assistant_image_input(sample: SquaresSample) -> list[dict[str, Any]]:
    return [
        {"type": "message", "role": "assistant", "content": [input_image(sample)]},
        {"type": "message", "role": "user", "content": [{"type": "input_text", "text": QUESTION}]},
    ]


def body(items: str | list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "default", "input": items, "max_output_tokens": MAX_OUTPUT_TOKENS, **extra}


def create(client: httpx.Client, payload: dict[str, Any]) -> dict[str, Any]:
    response = client.post("/v1/responses", json=payload)
    assert response.status_code == 200, response.text
    result: dict[str, Any] = response.json()
    assert result["status"] == "completed", result
    return result


def output_text(response: dict[str, Any]) -> str:
    return "".join(
        part.get("text", "")
        for item in response["output"]
        if item["type"] == "message"
        for part in item["content"]
        if part["type"] == "output_text"
    )


def function_calls(response: dict[str, Any]) -> list[dict[str, Any]]:
    return [item for item in response["output"] if item["type"] == "function_call"]


def run_all(work: Callable[[T], R], items: Sequence[T]) -> list[R]:
    with ThreadPoolExecutor(max_workers=WORKERS) as pool:
        return list(pool.map(work, items))


def accuracy(answers: Sequence[str], samples: Sequence[SquaresSample]) -> float:
    return sum(
        answer.strip() == sample.answer for answer, sample in zip(answers, samples, strict=True)
    ) / len(samples)
