"""The facade's own SSE frame encoding (delivery.encoded, EventStream) writes exactly what
sse-starlette's encoder writes: clients see the same bytes, only cheaper to make."""

from __future__ import annotations

import pytest
from sse_starlette import EventSourceResponse, ServerSentEvent

from vlmserve.facade.responses.delivery import SSE_SEPARATOR, EventStream, encoded, sse_event

FRAMES = [
    sse_event('{"type":"response.output_text.delta","delta":" the"}', "response.output_text.delta"),
    sse_event("[DONE]"),
    sse_event('{"choices":[{"delta":{"content":"\\u00e9 \\"q\\""}}]}'),
    sse_event("é ünïcode", "content_block_delta"),
    sse_event("", "ping"),
    # The general encoder's cases: several lines, CR LF, an id, a comment, another separator.
    sse_event("one\ntwo\r\nthree\rfour", "multi"),
    sse_event("data", "name\nbroken"),
    ServerSentEvent(data="x", event="e", id="7", sep=SSE_SEPARATOR),
    ServerSentEvent(data="x", comment="keep-alive", sep=SSE_SEPARATOR),
    ServerSentEvent(data="x", retry=1000, sep=SSE_SEPARATOR),
    ServerSentEvent(data="x", event="e"),
    ServerSentEvent(data=3, event="e", sep=SSE_SEPARATOR),
]


@pytest.mark.parametrize("frame", FRAMES, ids=range(len(FRAMES)))
def test_a_frame_is_encoded_as_sse_starlette_encodes_it(frame: ServerSentEvent) -> None:
    assert encoded(frame) == frame.encode()


def test_the_plain_frames_take_the_direct_path() -> None:
    # The direct path writes LF lines: what a strict SSE parser needs (delivery.SSE_SEPARATOR).
    assert encoded(FRAMES[0]) == (
        b'event: response.output_text.delta\ndata: {"type":"response.output_text.delta","delta":" the"}\n\n'
    )
    assert encoded(FRAMES[1]) == b"data: [DONE]\n\n"


def test_the_send_it_replaces_is_still_sse_starlettes() -> None:
    # EventStream overrides this method of sse-starlette's response: if a release renamed it,
    # the override would silently stop applying.
    assert "_send_with_timeout" in vars(EventSourceResponse)
    assert "_send_with_timeout" in vars(EventStream)
