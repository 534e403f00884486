"""A recording gRPC hop between the facade and the real engine.

The facade process talks to this proxy as if it were the engine; every call is forwarded to the
real engine unchanged, and the proxy keeps each GenerateRequest it saw and the engine's own
GenerateResult for it. Tests then assert on what the engine really received (its `usage.image_count`,
the lowered messages), not on facade logs.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from vlmserve.client import channel_options, server_options
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc


@dataclass
class RecordedCall:
    request: pb.GenerateRequest
    result: pb.GenerateResult | None = None


@dataclass
class Recording:
    calls: list[RecordedCall] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, request: pb.GenerateRequest) -> RecordedCall:
        call = RecordedCall(request=request)
        with self.lock:
            self.calls.append(call)
        return call


def _forward_error(context: grpc.ServicerContext, error: grpc.RpcError) -> None:
    code = error.code() if isinstance(error, grpc.Call) else grpc.StatusCode.UNKNOWN
    details = error.details() if isinstance(error, grpc.Call) else str(error)
    context.abort(code, details or "")


def _canceller(call: grpc.RpcContext) -> Callable[[], None]:
    def cancel() -> None:
        call.cancel()

    return cancel


class _RecordingEngine(pb_grpc.EngineServiceServicer):
    def __init__(self, upstream: pb_grpc.EngineServiceStub, recording: Recording) -> None:
        self._upstream = upstream
        self._recording = recording

    def Generate(
        self, request: pb.GenerateRequest, context: grpc.ServicerContext
    ) -> Iterator[pb.GenerateResponse]:
        call = self._recording.add(request)
        stream = self._upstream.Generate(request, timeout=context.time_remaining())
        # A facade that hangs up cancels the upstream call too, as it would against the engine.
        context.add_callback(_canceller(stream))
        try:
            for message in stream:
                if message.HasField("complete"):
                    call.result = message.complete
                yield message
        except grpc.RpcError as error:
            _forward_error(context, error)

    def GenerateUnary(
        self, request: pb.GenerateUnaryRequest, context: grpc.ServicerContext
    ) -> pb.GenerateUnaryResponse:
        call = self._recording.add(request.request)
        try:
            response: pb.GenerateUnaryResponse = self._upstream.GenerateUnary(
                request, timeout=context.time_remaining()
            )
        except grpc.RpcError as error:
            _forward_error(context, error)
            raise
        call.result = response.result
        return response

    def CountTokens(
        self, request: pb.CountTokensRequest, context: grpc.ServicerContext
    ) -> pb.CountTokensResponse:
        try:
            response: pb.CountTokensResponse = self._upstream.CountTokens(
                request, timeout=context.time_remaining()
            )
        except grpc.RpcError as error:
            _forward_error(context, error)
            raise
        return response

    def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.ServicerContext
    ) -> pb.GetModelInfoResponse:
        try:
            response: pb.GetModelInfoResponse = self._upstream.GetModelInfo(
                request, timeout=context.time_remaining()
            )
        except grpc.RpcError as error:
            _forward_error(context, error)
            raise
        return response

    def Abort(self, request: pb.AbortRequest, context: grpc.ServicerContext) -> pb.AbortResponse:
        try:
            response: pb.AbortResponse = self._upstream.Abort(request, timeout=context.time_remaining())
        except grpc.RpcError as error:
            _forward_error(context, error)
            raise
        return response


class _ForwardedHealth(health_pb2_grpc.HealthServicer):  # type: ignore[misc]  # untyped stubs
    def __init__(self, upstream: health_pb2_grpc.HealthStub) -> None:
        self._upstream = upstream

    def Check(
        self, request: health_pb2.HealthCheckRequest, context: grpc.ServicerContext
    ) -> health_pb2.HealthCheckResponse:
        try:
            response: health_pb2.HealthCheckResponse = self._upstream.Check(request, timeout=5)
        except grpc.RpcError as error:
            _forward_error(context, error)
            raise
        return response


@dataclass
class EngineRecorder:
    address: str
    recording: Recording
    _server: grpc.Server
    _channel: grpc.Channel

    def stop(self) -> None:
        self._server.stop(grace=1).wait()
        self._channel.close()


def start_engine_recorder(engine_address: str) -> EngineRecorder:
    channel = grpc.insecure_channel(engine_address, options=channel_options())
    recording = Recording()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=8), options=server_options())
    pb_grpc.add_EngineServiceServicer_to_server(
        _RecordingEngine(pb_grpc.EngineServiceStub(channel), recording), server
    )
    health_pb2_grpc.add_HealthServicer_to_server(
        _ForwardedHealth(health_pb2_grpc.HealthStub(channel)), server
    )
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return EngineRecorder(f"127.0.0.1:{port}", recording, server, channel)
