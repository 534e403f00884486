"""The grpc.aio server: EngineService, grpc.health.v1, reflection, drain on shutdown.

Handlers are thin: hold a queue place, prepare (in a preparation worker thread, no MLX), enqueue,
then relay the job's events. Bad input ends the call with a status code (`RequestError.code`)
and structured details (`RequestError.to_status`), never INTERNAL; an unexpected exception is
INTERNAL with a fixed message (`_guarded`). A handler that ends early (client cancel,
disconnect, deadline) cancels its job.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import contextvars
import functools
import inspect
import logging
import threading
import time
from collections.abc import AsyncGenerator, AsyncIterator, Callable
from typing import Any, NoReturn, TypeVar, cast

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_health.v1._async import HealthServicer
from grpc_reflection.v1alpha import reflection
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind, StatusCode

from vlmserve.client import MAX_MESSAGE_BYTES, server_options
from vlmserve.common.tracing import extract_context, record_span, tracer
from vlmserve.engine.config import EngineConfig
from vlmserve.engine.distributed import generator_for
from vlmserve.engine.jobs import (
    CountedEvent,
    Event,
    FailedEvent,
    FinishedEvent,
    Job,
    JobKind,
    PreparedRequest,
    ReasoningEvent,
    TextEvent,
    ToolCallDeltaEvent,
    ToolCallEvent,
)
from vlmserve.engine.loop.generator import Generator
from vlmserve.engine.model import LoadedModel
from vlmserve.engine.prep.preparer import RequestPreparer
from vlmserve.engine.request_errors import RequestError, internal_error, invalid_argument
from vlmserve.engine.rpc.auth import EngineSecurity
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc
from vlmserve.server.logs import bind

__all__ = ["ENGINE_SERVICE_NAME", "EngineServer", "EngineServicer"]

log = logging.getLogger(__name__)

ENGINE_SERVICE_NAME: str = pb.DESCRIPTOR.services_by_name["EngineService"].full_name
_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _abort(context: grpc.aio.ServicerContext[Any, Any], error: RequestError) -> NoReturn:
    status = error.to_status()
    await context.abort(status.code, status.details, status.trailing_metadata)
    raise AssertionError("context.abort returned")  # pragma: no cover - abort always raises


Handler = TypeVar("Handler", bound=Callable[..., Any])


def _guarded(handler: Handler) -> Handler:
    """End the call with the RequestError's status; any other exception is INTERNAL, logged here.

    Without this grpc.aio answers an escaping exception with UNKNOWN and the exception's text
    (a RecursionError's message, a file path) in the status details.
    """

    async def fail(context: grpc.aio.ServicerContext[Any, Any], error: Exception) -> NoReturn:
        if isinstance(error, RequestError):
            await _abort(context, error)
        log.exception("%s failed", handler.__name__, exc_info=error)
        await _abort(context, internal_error())

    if inspect.isasyncgenfunction(handler):

        @functools.wraps(handler)
        async def stream(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
            # The ids are bound around each step of the handler, never across `yield`: a
            # generator left suspended there (grpc.aio, when a call ends while a message is
            # being written) is closed by the loop's finaliser in another context, where a
            # token held across the yield cannot be reset (an ERROR and an abort for a call
            # that succeeded).
            request_id = _request_id(request)
            responses = handler(self, request, context)
            try:
                while True:
                    try:
                        with bind(request_id=request_id):
                            response = await anext(responses)
                    except StopAsyncIteration:
                        return
                    except grpc.aio.AbortError:
                        raise
                    except Exception as error:
                        await fail(context, error)
                    yield response
            finally:
                with bind(request_id=request_id):
                    await responses.aclose()

        return cast(Handler, stream)

    @functools.wraps(handler)
    async def unary(self: Any, request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        try:
            with bind(request_id=_request_id(request)):
                return await handler(self, request, context)
        except grpc.aio.AbortError:
            raise
        except Exception as error:
            await fail(context, error)

    return cast(Handler, unary)


def _request_id(request: Any) -> str | None:
    """The caller's request id, for the log lines of its call (the facade sends the response id)."""
    inner = getattr(request, "request", request)
    return getattr(inner, "request_id", None) or None


def _server_span(
    method: str, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
) -> trace.Span:
    """The SERVER span of one call, child of the caller's span when its metadata carries one."""
    return tracer().start_span(
        f"vlmserve.engine.v1.EngineService/{method}",
        context=extract_context(context.invocation_metadata()),
        kind=SpanKind.SERVER,
        attributes={"vlmserve.request_id": request.request_id},
    )


class EngineServicer(pb_grpc.EngineServiceServicer):
    def __init__(self, generator: Generator, workers: concurrent.futures.Executor) -> None:
        self._generator = generator
        # Request preparation (decoding, rendering, tokenizing) runs here, never on the
        # generation thread and never on the event loop.
        self._workers = workers

    def _preparer(self) -> RequestPreparer:
        preparer = self._generator.preparer
        if preparer is None or not self._generator.ready.is_set():
            raise RequestError(
                grpc.StatusCode.UNAVAILABLE,
                f"the model is still loading: {self._generator.load_progress.describe()}; retry shortly",
                retry_after_s=1.0,
            )
        return preparer

    async def _prepare(self, request: pb.GenerateRequest, kind: JobKind) -> PreparedRequest:
        """Run request preparation in a worker thread; the work stops if the caller leaves."""
        preparer = self._preparer()
        left = threading.Event()
        prepare = functools.partial(preparer.prepare, request, kind=kind, cancelled=left.is_set)
        try:
            # In the caller's context: the worker's log lines carry its request id.
            in_context = functools.partial(contextvars.copy_context().run, prepare)
            return await asyncio.get_running_loop().run_in_executor(self._workers, in_context)
        finally:
            left.set()  # a no-op when preparation finished; stops it between images otherwise

    async def _admit(self, request: pb.GenerateRequest, trace_context: Context) -> Job:
        self._preparer()
        # A queue place first: a full engine refuses before decoding or tokenizing anything.
        self._generator.admission.reserve()
        started = time.perf_counter()
        try:
            prepared = await self._prepare(request, JobKind.GENERATE)
        except BaseException:
            self._generator.admission.release()
            raise
        finally:
            record_span("engine.prepare", trace_context, started, time.perf_counter())
        job = Job(prepared, asyncio.get_running_loop(), trace_context=trace_context)
        self._generator.submit(job, reserved=True)
        return job

    async def _events(self, job: Job) -> AsyncIterator[Event]:
        """The job's events, consecutive text merged; cancels the job if the caller leaves early."""
        pending: Event | None = None
        ended = False
        try:
            while True:
                event = pending if pending is not None else await job.events.get()
                pending = None
                if isinstance(event, TextEvent):
                    text, logprobs = event.text, list(event.logprobs)
                    while not job.events.empty():
                        following = job.events.get_nowait()
                        if isinstance(following, TextEvent):
                            text += following.text
                            logprobs.extend(following.logprobs)
                        else:
                            pending = following
                            break
                    event = TextEvent(text, tuple(logprobs))
                ended = isinstance(event, FinishedEvent | FailedEvent | CountedEvent)
                yield event
                if ended:
                    return
        finally:
            if not ended:
                job.cancel()

    async def _responses(
        self, request: pb.GenerateRequest, method: str, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncGenerator[pb.GenerateResponse, None]:
        """One generation as contract messages, under its server span: what `Generate` streams
        and `GenerateUnary` keeps the result of (one implementation for both)."""
        span = _server_span(method, request, context)
        try:
            job = await self._admit(request, trace.set_span_in_context(span))
            # The model's `computer` calls go out as computer calls (engine/computer/adapter.py).
            computer = job.request.computer
            async for event in self._events(job):
                if isinstance(event, TextEvent):
                    yield pb.GenerateResponse(
                        chunk=pb.GenerateChunk(text=event.text, logprobs=event.logprobs)
                    )
                elif isinstance(event, ReasoningEvent):
                    yield pb.GenerateResponse(chunk=pb.GenerateChunk(reasoning_text=event.text))
                elif isinstance(event, ToolCallEvent):
                    call = computer.call(event.call) if computer else event.call
                    yield pb.GenerateResponse(chunk=pb.GenerateChunk(tool_call=call))
                elif isinstance(event, ToolCallDeltaEvent):
                    delta = computer.delta(event.delta) if computer else event.delta
                    if delta is not None:
                        yield pb.GenerateResponse(chunk=pb.GenerateChunk(tool_call_delta=delta))
                elif isinstance(event, FinishedEvent):
                    result = computer.result(event.result) if computer else event.result
                    yield pb.GenerateResponse(complete=result)
                elif isinstance(event, FailedEvent):
                    span.set_status(StatusCode.ERROR, event.error.code.name)
                    await _abort(context, event.error)
        finally:
            span.end()

    @_guarded
    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.GenerateResponse]:
        async with contextlib.aclosing(self._responses(request, "Generate", context)) as responses:
            async for response in responses:
                yield response

    @_guarded
    async def GenerateUnary(
        self, request: pb.GenerateUnaryRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GenerateUnaryResponse:
        async with contextlib.aclosing(
            self._responses(request.request, "GenerateUnary", context)
        ) as responses:
            async for response in responses:
                if response.HasField("complete"):
                    return pb.GenerateUnaryResponse(result=response.complete)
        raise RequestError(grpc.StatusCode.INTERNAL, "generation ended without a result")

    @_guarded
    async def CountTokens(
        self, request: pb.CountTokensRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.CountTokensResponse:
        # Answered by preparation alone: counting needs no generation thread.
        prepared = await self._prepare(request.request, JobKind.COUNT_TOKENS)
        return pb.CountTokensResponse(input_tokens=len(prepared.prompt_ids), image_count=prepared.image_count)

    @_guarded
    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.GetModelInfoResponse:
        preparer = self._preparer()
        info, lifecycle = preparer.info, self._generator.lifecycle
        return pb.GetModelInfoResponse(
            model_id=info.model_id,
            architecture=info.architecture,
            context_length=info.context_length,
            input_modalities=[pb.MODALITY_TEXT, pb.MODALITY_IMAGE]
            if preparer.takes_images
            else [pb.MODALITY_TEXT],
            image_limits=pb.ImageLimits(
                max_images_per_request=info.max_images_per_request,
                max_image_bytes=info.image_limits.max_bytes,
                max_image_pixels=info.image_limits.max_pixels,
                media_types=list(info.media_types),
            ),
            has_chat_template=info.has_chat_template,
            max_output_tokens=info.max_output_tokens,
            tool_call_format=info.tool_call_format,
            loaded_at=int(lifecycle.loaded_at),
            weights=lifecycle.state,
            thinking=info.thinking,
        )

    @_guarded
    async def Abort(
        self, request: pb.AbortRequest, context: grpc.aio.ServicerContext[Any, Any]
    ) -> pb.AbortResponse:
        if not request.request_id:
            raise invalid_argument("request_id must not be empty", field="request_id")
        return pb.AbortResponse(found=self._generator.admission.abort(request.request_id))


class EngineServer:
    """Owns the gRPC server and the generator. Start serving health first, then load."""

    def __init__(
        self,
        config: EngineConfig,
        *,
        security: EngineSecurity | None = None,
        max_message_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.generator = generator_for(config)
        self._workers = concurrent.futures.ThreadPoolExecutor(
            max_workers=config.prepare_workers, thread_name_prefix="vlmserve-prepare"
        )
        self.health = HealthServicer()
        self._security = security if security is not None else EngineSecurity()
        self._server = grpc.aio.server(
            options=server_options(max_message_bytes), interceptors=self._security.interceptors()
        )
        servicer = EngineServicer(self.generator, self._workers)
        pb_grpc.add_EngineServiceServicer_to_server(servicer, self._server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, self._server)
        reflection.enable_server_reflection(
            (
                ENGINE_SERVICE_NAME,
                health_pb2.DESCRIPTOR.services_by_name["Health"].full_name,
                reflection.SERVICE_NAME,
            ),
            self._server,
        )
        self._loop: asyncio.AbstractEventLoop | None = None
        self._load_done: asyncio.Event | None = None

    async def start(self, address: str) -> str:
        """Bind and serve (health NOT_SERVING until loaded). Returns the bound address."""
        self._loop = asyncio.get_running_loop()
        self._load_done = asyncio.Event()
        for service in ("", ENGINE_SERVICE_NAME):
            await self.health.set(service, _NOT_SERVING)
        try:
            port = self._security.add_port(self._server, address)
        except RuntimeError:  # grpcio's bind failure; its text says only "failed to bind"
            port = 0
        if port == 0:
            # SO_REUSEPORT is off (server_options), so a taken port fails here instead of
            # silently sharing connections with whatever already listens there.
            raise OSError(f"could not bind {address}: the address is in use or not available")
        if not address.startswith("unix:"):
            host = address.rsplit(":", 1)[0]
            address = f"{host}:{port}"
        await self._server.start()
        log.info("listening on %s", address)
        return address

    def load(self) -> None:
        """Start the generation thread: it loads and warms the model, then health turns SERVING."""
        self.generator.start(on_ready=self._on_ready)

    def _on_ready(self, loaded: LoadedModel | None, error: BaseException | None) -> None:
        # Called on the generation thread; hop to the event loop.
        assert self._loop is not None
        self._loop.call_soon_threadsafe(lambda: asyncio.ensure_future(self._mark_loaded(loaded is not None)))

    async def _mark_loaded(self, ok: bool) -> None:
        if ok:
            for service in ("", ENGINE_SERVICE_NAME):
                await self.health.set(service, _SERVING)
        assert self._load_done is not None
        self._load_done.set()

    async def wait_loaded(self) -> None:
        """Wait until loading finished; raises the load error if it failed."""
        assert self._load_done is not None
        await self._load_done.wait()
        if self.generator.load_error is not None:
            raise self.generator.load_error

    async def shutdown(self, grace_seconds: float = 30.0) -> None:
        """NOT_SERVING, refuse new work, let in-flight requests finish for up to the grace, then stop."""
        self.generator.admission.stop_accepting()
        await self.health.enter_graceful_shutdown()
        if not await asyncio.to_thread(self.generator.wait_idle, grace_seconds):
            log.warning("grace period over: cancelling %d requests", self.generator.admission.in_flight)
        await asyncio.to_thread(self.generator.stop)
        # A moment for handlers to send the final messages of cancelled jobs.
        await self._server.stop(grace=1.0)
        self._workers.shutdown(wait=False, cancel_futures=True)
        log.info("stopped")
