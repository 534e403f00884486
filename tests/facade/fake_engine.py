"""A scripted engine: a real grpc.aio server implementing the contract, for facade tests.

The facade's tests are about HTTP behaviour, so the engine is faked here (and only here): it
records every request it receives, answers with a script, and notes when a call was cancelled.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from vlmserve.client import ENGINE_SERVICE_NAME, server_options
from vlmserve.engine.request_errors import RequestError
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

MODEL_ID = "fixture/tiny-vlm"
CONTEXT_LENGTH = 4096


@dataclass
class Script:
    """What the next Generate call does."""

    text_chunks: list[str] = field(default_factory=lambda: ["Hello", ", ", "world."])
    tool_calls: list[pb.ToolCall] = field(default_factory=list)
    # Streamed call arguments, sent after the text and before the whole calls.
    tool_call_deltas: list[pb.ToolCallDelta] = field(default_factory=list)
    # Sent before the text, as a thinking model's reasoning.
    reasoning_chunks: list[str] = field(default_factory=list)
    # Per text chunk, its tokens: sent (and in the result) when the request asks for logprobs.
    text_logprobs: list[list[pb.TokenLogprob]] = field(default_factory=list)
    finish_reason: pb.FinishReason.ValueType = pb.FINISH_REASON_STOP
    # The stop sequence the result says ended the output.
    stop_sequence: str = ""
    usage: pb.Usage = field(
        default_factory=lambda: pb.Usage(input_tokens=11, output_tokens=3, cached_tokens=2)
    )
    # Fail with this status after `error_after` chunks (0: before any output): a RequestError
    # is what the engine itself sends (structured details); a (code, text) pair is a bare status,
    # as gRPC's own errors (size limits) are.
    error: RequestError | tuple[grpc.StatusCode, str] | None = None
    error_after: int = 0
    # Seconds between chunks; with `hang`, keep going until cancelled or aborted.
    delay_s: float = 0.0
    hang: bool = False
    # Seconds before the first message (a long prefill).
    first_delay_s: float = 0.0
    # Answer Abort with found=True but keep generating (a hung or buggy engine).
    ignore_abort: bool = False


async def _abort(
    context: grpc.aio.ServicerContext, error: RequestError | tuple[grpc.StatusCode, str]
) -> None:
    if isinstance(error, RequestError):
        status = error.to_status()
        await context.abort(status.code, status.details, status.trailing_metadata)
    await context.abort(error[0], error[1])


def model_info() -> pb.GetModelInfoResponse:
    return pb.GetModelInfoResponse(
        model_id=MODEL_ID,
        architecture="qwen2_vl",
        context_length=CONTEXT_LENGTH,
        input_modalities=[pb.MODALITY_TEXT, pb.MODALITY_IMAGE],
        has_chat_template=True,
        max_output_tokens=512,
        tool_call_format="hermes",
        loaded_at=1_700_000_000,
    )


class FakeEngine(pb_grpc.EngineServiceServicer):
    def __init__(self) -> None:
        self.script = Script()
        # What GetModelInfo answers (a test may serve another model).
        self.info = model_info()
        # Refuse requests that name another model than `info`'s, as the engine does (NOT_FOUND
        # naming `model`: "not served here").
        self.checks_model = False
        self.requests: list[pb.GenerateRequest] = []
        self.count_requests: list[pb.GenerateRequest] = []
        self.aborts: list[str] = []
        self.cancelled = asyncio.Event()
        self.started = asyncio.Event()
        self.chunks_sent = 0
        self._abort_events: dict[str, asyncio.Event] = {}

    def forget(self) -> None:
        """Drops what it recorded of past calls, for a test that sends many large requests: a
        recorded message keeps its bytes alive in protobuf's native memory, unseen by tracemalloc."""
        self.requests.clear()
        self.count_requests.clear()
        self.aborts.clear()
        self._abort_events.clear()

    async def Generate(
        self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.GenerateResponse]:
        self.requests.append(request)
        await self._check_model(request, context)
        script = self.script
        aborted = self._abort_events.setdefault(request.request_id, asyncio.Event())
        self.started.set()
        try:
            if script.first_delay_s:
                await asyncio.sleep(script.first_delay_s)
            chunks = [pb.GenerateChunk(reasoning_text=text) for text in script.reasoning_chunks]
            logprobs = script.text_logprobs if request.sampling.logprobs else []
            chunks += [
                pb.GenerateChunk(text=text, logprobs=logprobs[i] if i < len(logprobs) else [])
                for i, text in enumerate(script.text_chunks)
            ]
            chunks += [pb.GenerateChunk(tool_call_delta=delta) for delta in script.tool_call_deltas]
            chunks += [pb.GenerateChunk(tool_call=call) for call in script.tool_calls]
            sent_text: list[str] = []
            index = 0
            while index < len(chunks) or script.hang:
                if script.error is not None and index == script.error_after:
                    await _abort(context, script.error)
                if aborted.is_set():
                    yield _complete(request, "".join(sent_text), [], pb.FINISH_REASON_CANCELLED, script.usage)
                    return
                if index < len(chunks):
                    chunk = chunks[index]
                    sent_text.append(chunk.text)
                    self.chunks_sent += 1
                    yield pb.GenerateResponse(chunk=chunk)
                index += 1
                if script.delay_s or script.hang:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(aborted.wait(), script.delay_s or 0.05)
            if script.error is not None and script.error_after >= len(chunks):
                await _abort(context, script.error)
            yield _complete(
                request,
                "".join(sent_text),
                script.tool_calls,
                script.finish_reason,
                script.usage,
                reasoning_text="".join(script.reasoning_chunks),
                logprobs=[entry for chunk_logprobs in logprobs for entry in chunk_logprobs],
                stop_sequence=script.stop_sequence,
            )
        except asyncio.CancelledError:
            self.cancelled.set()
            raise

    async def GenerateUnary(
        self, request: pb.GenerateUnaryRequest, context: grpc.aio.ServicerContext
    ) -> pb.GenerateUnaryResponse:
        result = None
        async for response in self.Generate(request.request, context):
            if response.WhichOneof("event") == "complete":
                result = response.complete
        return pb.GenerateUnaryResponse(result=result)

    async def CountTokens(
        self, request: pb.CountTokensRequest, context: grpc.aio.ServicerContext
    ) -> pb.CountTokensResponse:
        self.count_requests.append(request.request)
        await self._check_model(request.request, context)
        if self.script.error is not None:
            await _abort(context, self.script.error)
        images = sum(
            1
            for message in request.request.messages
            for part in message.parts
            if part.WhichOneof("kind") == "image"
        )
        words = sum(
            len(part.text.text.split())
            for message in request.request.messages
            for part in message.parts
            if part.WhichOneof("kind") == "text"
        )
        return pb.CountTokensResponse(input_tokens=words + 10 * images, image_count=images)

    async def _check_model(self, request: pb.GenerateRequest, context: grpc.aio.ServicerContext) -> None:
        if self.checks_model and request.model and request.model != self.info.model_id:
            served = self.info.model_id
            error = RequestError(
                grpc.StatusCode.NOT_FOUND,
                f"model {request.model!r} is not served here; this engine serves {served!r}",
                field="model",
            )
            await _abort(context, error)

    async def GetModelInfo(
        self, request: pb.GetModelInfoRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetModelInfoResponse:
        return self.info

    async def Abort(self, request: pb.AbortRequest, context: grpc.aio.ServicerContext) -> pb.AbortResponse:
        self.aborts.append(request.request_id)
        event = self._abort_events.get(request.request_id)
        if event is None:
            return pb.AbortResponse(found=False)
        if not self.script.ignore_abort:
            event.set()
        return pb.AbortResponse(found=True)


def _complete(
    request: pb.GenerateRequest,
    text: str,
    tool_calls: list[pb.ToolCall],
    finish_reason: pb.FinishReason.ValueType,
    usage: pb.Usage,
    *,
    reasoning_text: str = "",
    logprobs: list[pb.TokenLogprob] | None = None,
    stop_sequence: str = "",
) -> pb.GenerateResponse:
    images = sum(
        1 for message in request.messages for part in message.parts if part.WhichOneof("kind") == "image"
    )
    counted = pb.Usage()
    counted.CopyFrom(usage)
    counted.image_count = images
    return pb.GenerateResponse(
        complete=pb.GenerateResult(
            request_id=request.request_id,
            model=MODEL_ID,
            text=text,
            reasoning_text=reasoning_text,
            logprobs=logprobs or [],
            tool_calls=tool_calls,
            finish_reason=finish_reason,
            usage=counted,
            stop_sequence=stop_sequence,
        )
    )


@dataclass
class RunningFakeEngine:
    servicer: FakeEngine
    health: health.aio.HealthServicer
    server: grpc.aio.Server
    address: str

    async def set_serving(self, serving: bool) -> None:
        status = (
            health_pb2.HealthCheckResponse.SERVING if serving else health_pb2.HealthCheckResponse.NOT_SERVING
        )
        await self.health.set(ENGINE_SERVICE_NAME, status)
        await self.health.set("", status)

    async def stop(self) -> None:
        await self.server.stop(grace=None)


async def start_fake_engine(address: str = "127.0.0.1:0") -> RunningFakeEngine:
    servicer = FakeEngine()
    health_servicer = health.aio.HealthServicer()
    # The real engine's message limits (100 MiB), not gRPC's 4 MB default.
    server = grpc.aio.server(options=server_options())
    pb_grpc.add_EngineServiceServicer_to_server(servicer, server)
    health_pb2_grpc.add_HealthServicer_to_server(health_servicer, server)
    port = server.add_insecure_port(address)
    await server.start()
    host = address.rsplit(":", 1)[0]
    running = RunningFakeEngine(servicer, health_servicer, server, f"{host}:{port}")
    await running.set_serving(True)
    return running
