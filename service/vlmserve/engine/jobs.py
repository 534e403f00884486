"""A request as the generation thread sees it, and the events it sends back.

The gRPC side builds a `Job` (prompt already tokenized, images already processed), hands it to the
generator, and reads `Event`s from the job's asyncio queue. The generation thread reaches the
event loop only through `Job.emit` (loop.call_soon_threadsafe), never directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from vlmserve.engine.computer.adapter import ComputerCalls
from vlmserve.engine.grammar.compiler import OutputConstraint
from vlmserve.engine.request_errors import RequestError
from vlmserve.engine.sampling import SamplingSettings
from vlmserve.engine.v1 import engine_pb2 as pb

__all__ = [
    "CountedEvent",
    "Event",
    "FailedEvent",
    "FinishedEvent",
    "Job",
    "JobKind",
    "JobReport",
    "PreparedClip",
    "PreparedImage",
    "PreparedRequest",
    "ReasoningEvent",
    "TextEvent",
    "ToolCallDeltaEvent",
    "ToolCallEvent",
    "array_bytes",
]


class JobKind(enum.Enum):
    GENERATE = "generate"
    COUNT_TOKENS = "count_tokens"


def array_bytes(array: np.ndarray) -> int:
    """Bytes an image array holds; an object array (differently shaped images) its items'."""
    if array.dtype == object:
        return sum(int(item.nbytes) for item in array)
    return int(array.nbytes)


@dataclass(frozen=True, slots=True)
class PreparedImage:
    """One image as the processor prepared it (numpy, no MLX)."""

    # sha256 of the client's bytes and the sizing applied: equal hashes, equal pixels seen.
    content_hash: str
    # Image tokens this image occupies in `PreparedRequest.prompt_ids` (0 for families prepared
    # as a whole request, whose processor writes the image's tokens itself).
    token_count: int
    # The processor's outputs for this image alone, axis 0 = its rows (qwen2_vl: pixel_values
    # (patches, dim) float32, image_grid_thw (1, 3)); a request concatenates them per key.
    # Empty for families prepared as a whole request (`PreparedRequest.joint_arrays`).
    arrays: Mapping[str, np.ndarray]
    # The client's encoded bytes of this image (metrics).
    byte_count: int = 0


@dataclass(frozen=True, slots=True)
class PreparedClip:
    """One video or audio clip as the family's processor rendered it (prep/clip_inputs.py)."""

    # sha256 of the part as sent and the sampling applied: equal hashes, equal inputs seen.
    content_hash: str
    kind: str  # "video" | "audio"
    # Its placeholder token runs in `PreparedRequest.prompt_ids`, (start, length) each (several
    # for a clip the processor writes frame by frame, with timestamps between).
    spans: tuple[tuple[int, int], ...]
    # The client's encoded bytes, frames sampled, seconds of media (metrics).
    byte_count: int = 0
    frames: int = 0
    seconds: float = 0.0

    @property
    def token_count(self) -> int:
        return sum(length for _, length in self.spans)


@dataclass(frozen=True, slots=True)
class PreparedRequest:
    """Everything the generation thread needs; built without MLX on the gRPC side."""

    request_id: str
    kind: JobKind
    # The prompt's token ids, image tokens expanded, client text tokenized as text.
    prompt_ids: tuple[int, ...]
    images: tuple[PreparedImage, ...]
    settings: SamplingSettings
    # For logs and debugging only: never tokenize it again.
    prompt_text: str = ""
    # "" when tool calls are not parsed for this request (no tools, tool_choice NONE, no format).
    tool_call_format: str = ""
    parallel_tool_calls: bool = True
    # At most this many calls (None: no limit).
    max_tool_calls: int | None = None
    # The grammar the output must match (JSON format, enforced tool choice); None: free.
    constraint: OutputConstraint | None = None
    # The prompt leaves `<think>` open: the output is reasoning up to `</think>`.
    thinking: bool = False
    # The offered tools as the chat template takes them: parsers of formats whose arguments are
    # text (qwen3_coder, glm47) type each value by its parameter's schema.
    tools: tuple[dict[str, Any], ...] = ()
    # Prefix-cache tenant (opaque; the facade sends a hash of the API key): a cached prefix is
    # only ever reused within the same partition.
    partition_key: str = ""
    # The request's image arrays as one (families whose processor pads or tiles across a
    # request's images; their `PreparedImage.arrays` are empty). None: join the per-image ones.
    joint_arrays: Mapping[str, np.ndarray] | None = None
    # The contract request this was prepared from (distributed.py sends it to the other ranks,
    # which prepare it again); None when built some other way.
    source: pb.GenerateRequest | None = None
    # Maps the model's `computer` calls back to the contract (a request with a computer tool).
    computer: ComputerCalls | None = None
    # Video and audio clips in prompt order (frames a family takes as images are `images`).
    clips: tuple[PreparedClip, ...] = ()
    # The clips' processor arrays (pixel_values_videos, video_grid_thw, input_features, ...)
    # for families whose images are prepared one by one; in `joint_arrays` for the others.
    clip_arrays: Mapping[str, np.ndarray] | None = None

    @property
    def image_count(self) -> int:
        return len(self.images)

    def image_arrays(self) -> dict[str, np.ndarray]:
        """All images' (and clips') processor arrays for the model, per key (empty without)."""
        clips = dict(self.clip_arrays or {})
        if self.joint_arrays is not None:
            return {**self.joint_arrays, **clips}
        if not self.images:
            return clips
        keys = self.images[0].arrays.keys()
        joined = {key: np.concatenate([image.arrays[key] for image in self.images], axis=0) for key in keys}
        return {**joined, **clips}


@dataclass(frozen=True, slots=True)
class TextEvent:
    text: str
    # With sampling.logprobs: the tokens this text settled (logprobs.py; may come with text "").
    logprobs: tuple[pb.TokenLogprob, ...] = ()


@dataclass(frozen=True, slots=True)
class ReasoningEvent:
    text: str


@dataclass(frozen=True, slots=True)
class ToolCallEvent:
    call: pb.ToolCall


@dataclass(frozen=True, slots=True)
class ToolCallDeltaEvent:
    """A call being written (streamed arguments); the `ToolCallEvent` with its id follows."""

    delta: pb.ToolCallDelta


@dataclass(frozen=True, slots=True)
class FinishedEvent:
    result: pb.GenerateResult


@dataclass(frozen=True, slots=True)
class CountedEvent:
    input_tokens: int
    image_count: int


@dataclass(frozen=True, slots=True)
class FailedEvent:
    error: RequestError


Event = (
    TextEvent
    | ReasoningEvent
    | ToolCallEvent
    | ToolCallDeltaEvent
    | FinishedEvent
    | CountedEvent
    | FailedEvent
)


@dataclass(frozen=True, slots=True)
class JobReport:
    """What a finished job did; kept by the engine for logs, metrics and tests."""

    request_id: str
    finish_reason: pb.FinishReason.ValueType
    prompt_tokens: int
    output_tokens: int
    # Tokens produced after cancellation was requested (the goal: at most one step's worth).
    tokens_after_cancel: int
    image_count: int
    # Prompt tokens taken from the prefix cache.
    cached_tokens: int = 0
    # The generated token ids (parity tests compare them).
    token_ids: tuple[int, ...] = ()


@dataclass(eq=False)
class Job:
    request: PreparedRequest
    # None for the engine's own jobs (warm-up): their events go nowhere.
    loop: asyncio.AbstractEventLoop | None
    events: asyncio.Queue[Event] = field(default_factory=asyncio.Queue)
    submitted_at: float = field(default_factory=time.perf_counter)
    # The OpenTelemetry context of the gRPC call's server span: the generation thread records
    # the job's queue / prefill / decode spans under it (None: not traced).
    trace_context: Any = None
    _cancel: threading.Event = field(default_factory=threading.Event)
    # Set by the generation thread when the job has sent its last event.
    done: threading.Event = field(default_factory=threading.Event)

    @property
    def request_id(self) -> str:
        return self.request.request_id

    def cancel(self) -> None:
        """Ask the generation thread to stop this job at its next step (any thread)."""
        self._cancel.set()

    @property
    def cancelled(self) -> bool:
        return self._cancel.is_set()

    def emit(self, event: Event) -> None:
        """Generation thread -> the job's asyncio queue. A closed loop means nobody listens."""
        if self.loop is None:
            return
        with contextlib.suppress(RuntimeError):
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
