"""langchain-openai (pinned in pyproject's dev extra) on the real stack, in both of its modes —
`use_responses_api=True` (POST /v1/responses) and the default (POST /v1/chat/completions) — against
`vlmserve-facade` in front of the random-weight fixture: a whole tool loop (bind_tools, the forced
call, the ToolMessage back, a final answer), and file content blocks (a PDF, a CSV).

The fixture model knows nothing: its call is well formed only because the engine's grammar enforces
it, and its free text runs to the token cap. So the assertions are about the loop, never content.
"""

from __future__ import annotations

import base64
from typing import Any

import pytest

from tests._pdfs import text_pdf

pytestmark = [pytest.mark.needs_model, pytest.mark.slow]

MAX_TOKENS = 48
MODES = {"responses": True, "chat": False}


@pytest.fixture(params=list(MODES))
def chat(request: pytest.FixtureRequest, random_facade_url: str) -> Any:
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model="default",
        base_url=f"{random_facade_url}/v1",
        api_key="x",  # type: ignore[arg-type]
        max_tokens=MAX_TOKENS,  # type: ignore[call-arg]
        max_retries=0,
        use_responses_api=MODES[request.param],
    )


def test_tool_loop(chat: Any) -> None:
    from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
    from langchain_core.tools import tool

    looked: list[str] = []

    @tool
    def lookup(city: str) -> str:
        """Facts about a city."""
        looked.append(city)
        return f"{city}: population 1000"

    messages: list[Any] = [HumanMessage("Look up Oslo.")]
    # "any" is LangChain's name for tool_choice "required": the grammar makes the model call.
    asked = chat.bind_tools([lookup], tool_choice="any").invoke(messages)
    assert isinstance(asked, AIMessage)
    (call,) = asked.tool_calls
    assert call["name"] == "lookup" and isinstance(call["args"]["city"], str)
    messages += [asked, lookup.invoke(call)]
    assert isinstance(messages[-1], ToolMessage) and looked == [call["args"]["city"]]

    answering = chat.bind_tools([lookup], tool_choice="none")
    final = answering.invoke(messages)
    assert isinstance(final, AIMessage) and final.tool_calls == []
    assert final.text  # the answer, cut at the cap: the random model never ends a turn itself
    # The call and its output reached the model: more input than the question alone.
    alone = answering.invoke(messages[:1])
    assert final.usage_metadata is not None and alone.usage_metadata is not None
    assert final.usage_metadata["input_tokens"] > alone.usage_metadata["input_tokens"]


def test_a_streamed_tool_call(chat: Any) -> None:
    from langchain_core.tools import tool

    @tool
    def lookup(city: str) -> str:
        """Facts about a city."""
        return city

    chunks = list(chat.bind_tools([lookup], tool_choice="any").stream("Look up Oslo."))
    assert len(chunks) > 1
    merged = chunks[0]
    for chunk in chunks[1:]:
        merged += chunk
    (call,) = merged.tool_calls
    assert call["name"] == "lookup" and isinstance(call["args"]["city"], str)
    assert not merged.text  # the answer is the call alone


FILES = {
    "pdf": ("application/pdf", "report.pdf", text_pdf(["Page one: apples", "Page two: pears"])),
    "csv": ("text/csv", "table.csv", b"fruit,count\napples,3\npears,5\n"),
}


@pytest.mark.parametrize("kind", list(FILES))
def test_a_file_block(chat: Any, kind: str) -> None:
    """LangChain's `file` content block: `input_file` on /v1/responses, a `file` part on chat."""
    from langchain_core.messages import AIMessage, HumanMessage

    mime_type, filename, data = FILES[kind]
    question = {"type": "text", "text": "What is in this file?"}
    block = {"type": "file", "base64": base64.b64encode(data).decode(), "mime_type": mime_type}
    answer = chat.invoke([HumanMessage(content=[question, {**block, "filename": filename}])])
    alone = chat.invoke([HumanMessage(content=[question])])
    assert isinstance(answer, AIMessage) and answer.text
    # The file reached the model: PDF pages as text and images, a CSV as text under its name.
    assert answer.usage_metadata is not None and alone.usage_metadata is not None
    assert answer.usage_metadata["input_tokens"] > alone.usage_metadata["input_tokens"]
