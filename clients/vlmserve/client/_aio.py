"""asyncio client for the engine."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from types import TracebackType
from typing import TypeVar

import grpc

from vlmserve.common.wire_encode import OutgoingRequest
from vlmserve.engine.v1 import engine_pb2 as pb

from ._base import EngineClientBase, Transport, UnaryCall
from ._options import ENGINE_SERVICE_NAME

T = TypeVar("T")


class AsyncEngineClient(EngineClientBase[grpc.aio.Channel]):
    """Calls the engine from asyncio: the calls, deadlines and errors of `EngineClientBase`
    (`target`, `token`, `deadlines`, `credentials`, `channel`), awaited."""

    _transport = Transport(grpc.aio.insecure_channel, grpc.aio.secure_channel)

    async def _send(self, call: UnaryCall[T]) -> T:
        try:
            response = await call.invoke()
        except grpc.RpcError as error:
            return call.failed(error)
        finally:
            call.done()
        return call.decode(response)

    async def generate(
        self,
        request: pb.GenerateRequest | OutgoingRequest,
        *,
        timeout: float | None = None,
    ) -> AsyncIterator[pb.GenerateResponse]:
        """Stream chunks, then one `complete`. Leaving the loop early cancels the call.
        An `OutgoingRequest` (`vlmserve.common.wire_encode`) is sent with the texts it holds apart."""
        stream = self._start_generate(request, timeout)
        try:
            async for response in stream.call:
                yield response
        except grpc.RpcError as error:
            stream.failed(error)
        finally:
            stream.close()

    async def generate_unary(
        self, request: pb.GenerateRequest, *, timeout: float | None = None
    ) -> pb.GenerateResult:
        """The whole generation in one answer."""
        return await self._send(self._generate_unary_call(request, timeout))

    async def count_tokens(
        self, request: pb.GenerateRequest, *, timeout: float | None = None
    ) -> pb.CountTokensResponse:
        return await self._send(self._count_tokens_call(request, timeout))

    async def model_info(self, *, timeout: float | None = None) -> pb.GetModelInfoResponse:
        return await self._send(self._model_info_call(timeout))

    async def abort(self, request_id: str, *, timeout: float | None = None) -> bool:
        """True when the engine had that request queued or running."""
        return await self._send(self._abort_call(request_id, timeout))

    async def health(self, service: str = ENGINE_SERVICE_NAME, *, timeout: float | None = None) -> bool:
        """True when the engine reports SERVING for `service` ("" is liveness)."""
        return await self._send(self._health_call(service, timeout))

    async def close(self, grace: float | None = None) -> None:
        await self._channel.close(grace)

    async def __aenter__(self) -> AsyncEngineClient:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()


def text_of(responses: Sequence[pb.GenerateResponse]) -> str:
    """The streamed text of a finished Generate call (chunks joined)."""
    return "".join(r.chunk.text for r in responses if r.WhichOneof("event") == "chunk")
