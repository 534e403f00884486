"""The engine's RPC wrapper (`rpc.server._guarded`): a streaming call closed from another
context logs nothing and aborts nothing.

asyncio closes an async generator that its task left suspended at `yield` (grpc.aio does when a
call ends while a message is being written) from the event loop's finaliser, in a new task and
so another context. A context-variable token held across the `yield` cannot be reset there: the
wrapper once caught that ValueError as a failure, logged `Generate failed` at ERROR and aborted a
call that had succeeded (`Task exception was never retrieved ... ExecuteBatchError`).
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import AsyncIterator
from typing import Any

import pytest

from vlmserve.engine.rpc.server import _guarded
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.server.logs import request_id_var


class _Context:
    aborted: list[Any]

    def __init__(self) -> None:
        self.aborted = []

    async def abort(self, *args: Any) -> None:
        self.aborted.append(args)
        raise RuntimeError("aborted")


class _Servicer:
    seen: list[str | None]

    def __init__(self) -> None:
        self.seen = []

    @_guarded
    async def Generate(self, request: pb.GenerateRequest, context: Any) -> AsyncIterator[int]:
        for n in range(3):
            self.seen.append(request_id_var.get())
            yield n


async def test_a_stream_closed_from_another_context_logs_no_error(caplog: pytest.LogCaptureFixture) -> None:
    servicer, context = _Servicer(), _Context()
    stream = servicer.Generate(pb.GenerateRequest(request_id="resp_1"), context)
    assert await anext(stream) == 0
    assert servicer.seen == ["resp_1"]
    assert request_id_var.get() is None  # the id is bound while the handler runs, not after
    with caplog.at_level(logging.DEBUG):
        # As the loop's async-generator finaliser does: aclose() in a task of its own context.
        await asyncio.get_running_loop().create_task(stream.aclose(), context=contextvars.Context())
    assert [r for r in caplog.records if r.levelno >= logging.ERROR] == []
    assert context.aborted == []


async def test_each_step_runs_with_the_request_id() -> None:
    servicer, context = _Servicer(), _Context()
    stream = servicer.Generate(pb.GenerateRequest(request_id="resp_2"), context)
    assert [n async for n in stream] == [0, 1, 2]
    assert servicer.seen == ["resp_2"] * 3
    assert context.aborted == []
