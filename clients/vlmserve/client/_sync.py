"""Blocking client for the engine, for scripts and threaded services."""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType
from typing import TypeVar

import grpc

from vlmserve.common.wire_encode import OutgoingRequest
from vlmserve.engine.v1 import engine_pb2 as pb

from ._base import EngineClientBase, Transport, UnaryCall
from ._options import ENGINE_SERVICE_NAME

T = TypeVar("T")


class EngineClient(EngineClientBase[grpc.Channel]):
    """Blocking twin of `AsyncEngineClient`, with the same calls, deadlines and errors."""

    _transport = Transport(grpc.insecure_channel, grpc.secure_channel)

    def _send(self, call: UnaryCall[T]) -> T:
        try:
            response = call.invoke()
        except grpc.RpcError as error:
            return call.failed(error)
        finally:
            call.done()
        return call.decode(response)

    def generate(
        self,
        request: pb.GenerateRequest | OutgoingRequest,
        *,
        timeout: float | None = None,
    ) -> Iterator[pb.GenerateResponse]:
        """Stream chunks, then one `complete`. Closing the iterator early cancels the call.
        An `OutgoingRequest` (`vlmserve.common.wire_encode`) is sent with the texts it holds apart."""
        stream = self._start_generate(request, timeout)
        try:
            yield from stream.call
        except grpc.RpcError as error:
            stream.failed(error)
        finally:
            stream.close()

    def generate_unary(
        self, request: pb.GenerateRequest, *, timeout: float | None = None
    ) -> pb.GenerateResult:
        """The whole generation in one answer."""
        return self._send(self._generate_unary_call(request, timeout))

    def count_tokens(
        self, request: pb.GenerateRequest, *, timeout: float | None = None
    ) -> pb.CountTokensResponse:
        return self._send(self._count_tokens_call(request, timeout))

    def model_info(self, *, timeout: float | None = None) -> pb.GetModelInfoResponse:
        return self._send(self._model_info_call(timeout))

    def abort(self, request_id: str, *, timeout: float | None = None) -> bool:
        """True when the engine had that request queued or running."""
        return self._send(self._abort_call(request_id, timeout))

    def health(self, service: str = ENGINE_SERVICE_NAME, *, timeout: float | None = None) -> bool:
        """True when the engine reports SERVING for `service` ("" is liveness)."""
        return self._send(self._health_call(service, timeout))

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
