"""EngineCall.messages() (engine_call.py) heartbeats: a None whenever `heartbeat_s` passes
without a message, and never while messages keep coming, however long the stream runs (its one
heartbeat timer fires mid-stream and is re-armed, not taken for silence)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any, cast

from vlmserve.client import AsyncEngineClient
from vlmserve.common.wire_encode import OutgoingRequest
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.facade.responses.engine_call import CallStopped, EngineCall


class PacedEngine:
    """An engine whose Generate sends a text chunk after each of `gaps` seconds."""

    def __init__(self, gaps: list[float]) -> None:
        self.gaps = gaps

    async def generate(
        self, request: Any, *, timeout: float | None = None
    ) -> AsyncIterator[pb.GenerateResponse]:
        for index, gap in enumerate(self.gaps):
            await asyncio.sleep(gap)
            yield pb.GenerateResponse(chunk=pb.GenerateChunk(text=str(index)))


def call(gaps: list[float], heartbeat_s: float | None) -> EngineCall:
    engine = cast(AsyncEngineClient, PacedEngine(gaps))
    request = OutgoingRequest(pb.GenerateRequest(request_id="r1"))
    return EngineCall(request, engine, timeout_s=30, heartbeat_s=heartbeat_s)


async def seen(engine_call: EngineCall) -> list[str | None]:
    return [None if message is None else message.chunk.text async for message in engine_call.messages()]


async def test_messages_faster_than_the_heartbeat_bring_none() -> None:
    # 10 messages 0.1 s apart: the stream outlasts the 0.35 s heartbeat three times over.
    assert await seen(call([0.1] * 10, heartbeat_s=0.35)) == [str(index) for index in range(10)]


async def test_silence_brings_a_heartbeat_each_time_it_passes() -> None:
    messages = await seen(call([0.05, 0.05, 1.0, 0.05], heartbeat_s=0.3))
    assert messages[:2] == ["0", "1"]
    gap = messages[2:-2]
    # 1 s of silence: three heartbeats (0.3, 0.6, 0.9), two if the machine is slow to wake us.
    assert gap and all(message is None for message in gap) and 2 <= len(gap) <= 3
    assert messages[-2:] == ["2", "3"]


async def test_without_a_heartbeat_the_reader_only_waits() -> None:
    assert await seen(call([0.0, 0.4, 0.0], heartbeat_s=None)) == ["0", "1", "2"]


async def test_a_close_from_here_stops_a_reader_waiting_for_a_message() -> None:
    engine_call = call([0.0, 30.0], heartbeat_s=0.2)
    got: list[str | None] = []

    async def read() -> None:
        async for message in engine_call.messages():
            got.append(None if message is None else message.chunk.text)
            if len(got) == 3:  # the first message and two heartbeats
                engine_call.close_from_here()

    started = asyncio.get_running_loop().time()
    try:
        await asyncio.wait_for(read(), 5)
    except CallStopped:
        pass
    else:
        raise AssertionError("the reader was not stopped")
    assert got == ["0", None, None]
    assert asyncio.get_running_loop().time() - started < 2
    await engine_call.close()
