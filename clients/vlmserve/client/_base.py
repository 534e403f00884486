"""What the blocking and the asyncio client share, written once (as httpx's `BaseClient`): the
channel, every call's request, deadline, metadata and trace span, how its answer is decoded and how
its failure is mapped. The two clients differ only in how they wait for the transport."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, ClassVar, Generic, NoReturn, TypeVar

import grpc
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc
from opentelemetry.trace import Span, StatusCode

from vlmserve.common.tracing import client_span, inject_metadata
from vlmserve.common.wire_encode import OutgoingRequest, encode
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

from ._errors import from_rpc_error
from ._options import DEFAULT_DEADLINES, MAX_MESSAGE_BYTES, Deadlines, auth_metadata, channel_options
from ._targets import balancing_options, engine_target, names_several_engines

ChannelT = TypeVar("ChannelT")
T = TypeVar("T")


def _raise_mapped(span: Span | None, error: grpc.RpcError) -> NoReturn:
    if span is not None:
        span.set_status(StatusCode.ERROR, error.code().name)
    raise from_rpc_error(error) from None


def _not_serving(error: grpc.RpcError) -> bool:
    # A health probe answers "not serving" for an unreachable or failing engine; it never raises.
    return False


def _result_of(response: pb.GenerateUnaryResponse) -> pb.GenerateResult:
    result: pb.GenerateResult = response.result
    return result


def _found(response: pb.AbortResponse) -> bool:
    return bool(response.found)


def _serving(response: health_pb2.HealthCheckResponse) -> bool:
    return bool(response.status == health_pb2.HealthCheckResponse.SERVING)


def _as_is(response: Any) -> Any:
    return response


class _Encoded:
    """A request's bytes, given to gRPC once. grpc's call object keeps its request until the
    call ends; its serializer takes the bytes out, so they go once sent (gRPC copies them)."""

    __slots__ = ("_data",)

    def __init__(self, data: bytes) -> None:
        self._data = data

    def take(self) -> bytes:
        data, self._data = self._data, b""
        return data


_GENERATE = "/vlmserve.engine.v1.EngineService/Generate"


@dataclass(frozen=True, slots=True)
class Transport:
    """A client's channel constructors: grpc's or grpc.aio's (the same signatures)."""

    insecure_channel: Callable[..., Any]
    secure_channel: Callable[..., Any]


@dataclass(slots=True)
class UnaryCall(Generic[T]):
    """One unary call, ready to send: the stub method, its request and call options, the decoding
    of its answer and what a failure becomes. Either client sends it its own way (`_send`)."""

    method: Callable[..., Any]
    request: Message
    timeout: float
    metadata: tuple[tuple[str, str], ...]
    decode: Callable[[Any], T]
    span: Span | None = None
    on_error: Callable[[grpc.RpcError], T] | None = None

    def invoke(self) -> Any:
        """The transport call: the answer (blocking stub) or an awaitable of it (asyncio stub)."""
        return self.method(self.request, timeout=self.timeout, metadata=self.metadata)

    def failed(self, error: grpc.RpcError) -> T:
        """A failure as the caller sees it: an `EngineError` subclass, or the call's own answer."""
        if self.on_error is not None:
            return self.on_error(error)
        _raise_mapped(self.span, error)

    def done(self) -> None:
        if self.span is not None:
            self.span.end()


@dataclass(slots=True)
class StreamCall:
    """An open `Generate` stream (a blocking or an asyncio call object) and its span."""

    call: Any
    span: Span

    def failed(self, error: grpc.RpcError) -> NoReturn:
        _raise_mapped(self.span, error)

    def close(self) -> None:
        # A consumer that stops reading (break, task cancel, disconnect) ends the generation.
        self.call.cancel()
        self.span.end()


class EngineClientBase(Generic[ChannelT]):
    """The engine's calls, transport aside. `target` is a gRPC target: "127.0.0.1:50051",
    "unix:/path/engine.sock", several engines comma-separated, ...; pass `channel` to use a channel
    you built (TLS, interceptors, in-process tests). Every call has a deadline (`deadlines`, or the
    call's `timeout`); failures raise `EngineError` subclasses."""

    _transport: ClassVar[Transport]

    def __init__(
        self,
        target: str = "127.0.0.1:50051",
        *,
        token: str | None = None,
        deadlines: Deadlines = DEFAULT_DEADLINES,
        credentials: grpc.ChannelCredentials | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
        channel: ChannelT | None = None,
    ) -> None:
        self._channel: ChannelT = (
            channel if channel is not None else self._open(target, credentials, max_message_bytes)
        )
        # grpc's stubs take either kind of channel; the calls below pass their methods on untyped.
        either: Any = self._channel
        self._stub: pb_grpc.EngineServiceStub | pb_grpc.EngineServiceAsyncStub = pb_grpc.EngineServiceStub(
            either
        )
        # Generate's request is written by `wire_encode.encode` (the same bytes as protobuf's, a
        # long text written from the caller's string a slice at a time) and sent as it is.
        self._generate = either.unary_stream(
            _GENERATE,
            request_serializer=_Encoded.take,
            response_deserializer=pb.GenerateResponse.FromString,
            _registered_method=True,
        )
        self._health = health_pb2_grpc.HealthStub(either)
        self._metadata = auth_metadata(token)
        self.deadlines = deadlines

    def _open(
        self, target: str, credentials: grpc.ChannelCredentials | None, max_message_bytes: int
    ) -> ChannelT:
        target = engine_target(target)
        options: list[tuple[str, Any]] = list(channel_options(max_message_bytes))
        if names_several_engines(target):
            options += balancing_options(max_message_bytes)
        if credentials is not None:
            channel: ChannelT = self._transport.secure_channel(target, credentials, options=options)
        else:
            channel = self._transport.insecure_channel(target, options=options)
        return channel

    def _start_generate(
        self, request: pb.GenerateRequest | OutgoingRequest, timeout: float | None
    ) -> StreamCall:
        span = client_span("Generate")
        encoded = request.encode() if isinstance(request, OutgoingRequest) else encode(request)
        call = self._generate(
            _Encoded(encoded),
            timeout=timeout or self.deadlines.generate,
            metadata=inject_metadata(self._metadata, span),
        )
        return StreamCall(call, span)

    def _generate_unary_call(
        self, request: pb.GenerateRequest, timeout: float | None
    ) -> UnaryCall[pb.GenerateResult]:
        span = client_span("GenerateUnary")
        return UnaryCall(
            self._stub.GenerateUnary,
            pb.GenerateUnaryRequest(request=request),
            timeout or self.deadlines.generate,
            inject_metadata(self._metadata, span),
            _result_of,
            span=span,
        )

    def _count_tokens_call(
        self, request: pb.GenerateRequest, timeout: float | None
    ) -> UnaryCall[pb.CountTokensResponse]:
        return UnaryCall(
            self._stub.CountTokens,
            pb.CountTokensRequest(request=request),
            timeout or self.deadlines.count_tokens,
            self._metadata,
            _as_is,
        )

    def _model_info_call(self, timeout: float | None) -> UnaryCall[pb.GetModelInfoResponse]:
        return UnaryCall(
            self._stub.GetModelInfo,
            pb.GetModelInfoRequest(),
            timeout or self.deadlines.model_info,
            self._metadata,
            _as_is,
        )

    def _abort_call(self, request_id: str, timeout: float | None) -> UnaryCall[bool]:
        return UnaryCall(
            self._stub.Abort,
            pb.AbortRequest(request_id=request_id),
            timeout or self.deadlines.abort,
            self._metadata,
            _found,
        )

    def _health_call(self, service: str, timeout: float | None) -> UnaryCall[bool]:
        return UnaryCall(
            self._health.Check,
            health_pb2.HealthCheckRequest(service=service),
            timeout or self.deadlines.health,
            self._metadata,
            _serving,
            on_error=_not_serving,
        )
