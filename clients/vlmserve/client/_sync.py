"""Blocking client for the engine, for scripts and threaded services."""

from __future__ import annotations

from collections.abc import Iterator
from types import TracebackType
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.trace import StatusCode

from vlmserve.common.tracing import client_span, inject_metadata
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

from ._errors import from_rpc_error
from ._options import (
    DEFAULT_DEADLINES,
    ENGINE_SERVICE_NAME,
    MAX_MESSAGE_BYTES,
    Deadlines,
    auth_metadata,
    channel_options,
)
from ._targets import balancing_options, engine_target, names_several_engines


class EngineClient:
    """Blocking twin of `AsyncEngineClient`, with the same calls, deadlines and errors."""

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        token: str | None = None,
        deadlines: Deadlines = DEFAULT_DEADLINES,
        credentials: grpc.ChannelCredentials | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        channel: grpc.Channel | None = None,
    ) -> None:
        if channel is None:
            target = engine_target(target)
            options: list[tuple[str, Any]] = list(channel_options(max_message_bytes))
            if names_several_engines(target):
                options += balancing_options(max_message_bytes)
            if credentials is not None:
                channel = grpc.secure_channel(target, credentials, options=options)
            else:
                channel = grpc.insecure_channel(target, options=options)
        self._channel = channel
        self._stub = pb_grpc.EngineServiceStub(channel)
        self._health = health_pb2_grpc.HealthStub(channel)
        self._metadata = auth_metadata(token)
        self.deadlines = deadlines

    def generate(
        self, request: pb.GenerateRequest, *, timeout: float | None = None
    ) -> Iterator[pb.GenerateResponse]:
        """Stream chunks, then one `complete`. Closing the iterator early cancels the call."""
        span = client_span("Generate")
        call = self._stub.Generate(
            request,
            timeout=timeout or self.deadlines.generate,
            metadata=inject_metadata(self._metadata, span),
        )
        try:
            yield from call
        except grpc.RpcError as error:
            span.set_status(StatusCode.ERROR, error.code().name)
            raise from_rpc_error(error) from None
        finally:
            call.cancel()
            span.end()

    def generate_unary(
        self, request: pb.GenerateRequest, *, timeout: float | None = None
    ) -> pb.GenerateResult:
        span = client_span("GenerateUnary")
        try:
            response = self._stub.GenerateUnary(
                pb.GenerateUnaryRequest(request=request),
                timeout=timeout or self.deadlines.generate,
                metadata=inject_metadata(self._metadata, span),
            )
        except grpc.RpcError as error:
            span.set_status(StatusCode.ERROR, error.code().name)
            raise from_rpc_error(error) from None
        finally:
            span.end()
        result: pb.GenerateResult = response.result
        return result

    def count_tokens(
        self, request: pb.GenerateRequest, *, timeout: float | None = None
    ) -> pb.CountTokensResponse:
        try:
            response: pb.CountTokensResponse = self._stub.CountTokens(
                pb.CountTokensRequest(request=request),
                timeout=timeout or self.deadlines.count_tokens,
                metadata=self._metadata,
            )
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return response

    def model_info(self, *, timeout: float | None = None) -> pb.GetModelInfoResponse:
        try:
            response: pb.GetModelInfoResponse = self._stub.GetModelInfo(
                pb.GetModelInfoRequest(),
                timeout=timeout or self.deadlines.model_info,
                metadata=self._metadata,
            )
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return response

    def abort(self, request_id: str, *, timeout: float | None = None) -> bool:
        try:
            response = self._stub.Abort(
                pb.AbortRequest(request_id=request_id),
                timeout=timeout or self.deadlines.abort,
                metadata=self._metadata,
            )
        except grpc.RpcError as error:
            raise from_rpc_error(error) from None
        return bool(response.found)

    def health(self, service: str = ENGINE_SERVICE_NAME, *, timeout: float | None = None) -> bool:
        try:
            response = self._health.Check(
                health_pb2.HealthCheckRequest(service=service),
                timeout=timeout or self.deadlines.health,
                metadata=self._metadata,
            )
        except grpc.RpcError:
            return False
        return bool(response.status == health_pb2.HealthCheckResponse.SERVING)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> EngineClient:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()
