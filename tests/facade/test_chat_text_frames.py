"""The chat route's text frames from a template (routes/chat.py `_TextFrames`) are the bytes the
chunk model's JSON gives, for every text a token can be; and only plain text deltas take it."""

from __future__ import annotations

import pytest

from vlmserve.chat import ChunkWriter
from vlmserve.facade.routes.chat import _data, _TextFrames
from vlmserve.responses import OutputTextDeltaEvent

TEXTS = [
    " the",
    "é",
    '"quoted" \\ back',
    "line\nbreak\r\n",
    "\t\x00\x1f",
    "😀 \ud83d",
    "\ufdd0text\ufdd0",
    "</s>",
    "{}",
]


def writer(**options: bool) -> ChunkWriter:
    return ChunkWriter("resp_0123abc", 1796610666, 'model "x" é', include_usage=True, **options)


def delta(text: str) -> OutputTextDeltaEvent:
    return OutputTextDeltaEvent(
        sequence_number=4, item_id="msg_1", output_index=0, content_index=0, delta=text
    )


@pytest.mark.parametrize("text", TEXTS)
def test_a_text_frame_is_the_chunks_json(text: str) -> None:
    chunks = writer()
    frames = _TextFrames(chunks)
    frames("warm")  # the template made from the first text, reused for this one
    assert frames(text).encode() == _data(chunks.text_chunk(text).to_json()).encode()


def test_only_a_plain_text_delta_after_the_role_takes_the_template() -> None:
    chunks = writer()
    assert chunks.plain_text(delta("a")) is None  # the role's chunk comes first
    assert [chunk.choices[0].delta.role for chunk in chunks.chunks(delta("a"))] == ["assistant", None]
    assert chunks.plain_text(delta("b")) == "b"
    assert chunks.plain_text(delta("")) is None
    with_logprobs = writer(logprobs=True)
    with_logprobs.chunks(delta("a"))
    assert with_logprobs.plain_text(delta("b")) is None
