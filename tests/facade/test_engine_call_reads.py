"""How EngineCall.messages() (engine_call.py) reads the engine's stream: one task (the pump)
reads ahead of the reader by at most two messages (one handed over, one read), and nothing is
read after the `complete` message until the reader asks (a read cut short by the reader's end
would cancel a call that ended well).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any, cast

from vlmserve.client import AsyncEngineClient
from vlmserve.common.wire_encode import OutgoingRequest
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.responses.engine_call import EngineCall


class CountingEngine:
    """Generate: `chunks` text chunks at once, then `complete`; counts what was read of it."""

    def __init__(self, chunks: int) -> None:
        self.chunks = chunks
        self.pulled = 0
        self.read_past_complete = False
        self.closed_early = False

    async def generate(
        self, request: Any, *, timeout: float | None = None
    ) -> AsyncIterator[pb.GenerateResponse]:
        try:
            for index in range(self.chunks):
                self.pulled += 1
                yield pb.GenerateResponse(chunk=pb.GenerateChunk(text=str(index)))
            self.pulled += 1
            yield pb.GenerateResponse(complete=pb.GenerateResult(text="done"))
            self.read_past_complete = True
        except GeneratorExit:
            self.closed_early = True
            raise


def call(engine: CountingEngine) -> EngineCall:
    request = OutgoingRequest(pb.GenerateRequest(request_id="r1"))
    return EngineCall(request, cast(AsyncEngineClient, engine), timeout_s=30, heartbeat_s=5)


async def test_the_pump_reads_at_most_two_messages_ahead_of_a_slow_reader() -> None:
    engine = CountingEngine(chunks=8)
    engine_call = call(engine)
    consumed = 0
    async for message in engine_call.messages():
        assert message is not None
        consumed += 1
        # The reader holds message `consumed`; the next one waits handed over, the pump holds
        # the one after; no more.
        for _ in range(5):  # plenty of turns for a pump that would read on
            await asyncio.sleep(0)
        assert engine.pulled <= consumed + 2
        if message.WhichOneof("event") == "complete":
            break
    assert consumed == 9
    await engine_call.close()


async def test_nothing_is_read_past_complete_unless_asked() -> None:
    engine = CountingEngine(chunks=3)
    engine_call = call(engine)
    reader = cast(AsyncGenerator[pb.GenerateResponse | None, None], engine_call.messages())
    async for message in reader:
        assert message is not None
        if message.WhichOneof("event") == "complete":
            break
    for _ in range(5):
        await asyncio.sleep(0)
    assert not engine.read_past_complete
    await reader.aclose()  # the reader's end: its pump stops without a read to cut short
    await engine_call.close()
    assert not engine.read_past_complete


async def test_a_reader_that_reads_on_after_complete_sees_the_end() -> None:
    engine = CountingEngine(chunks=2)
    engine_call = call(engine)
    kinds = [message.WhichOneof("event") async for message in engine_call.messages() if message is not None]
    assert kinds == ["chunk", "chunk", "complete"]
    assert engine.read_past_complete and not engine.closed_early
    await engine_call.close()
