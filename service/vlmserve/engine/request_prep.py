"""A contract request -> a `PreparedRequest` for the generation thread. No MLX.

Checks the model name, sampling values, messages and images (decoded here, with the shared
checks in `vlmserve.common.images`), and renders the prompt with the model's chat template. Runs in
a worker thread (image decoding and template rendering take real time on big inputs).
"""

from __future__ import annotations

import uuid

import grpc

from vlmserve.common.images import ImageError, decode_image
from vlmserve.engine.v1 import engine_pb2 as pb

from .grammar import GrammarCompiler, constraint_for
from .jobs import JobKind, PreparedRequest
from .model import ModelInfo
from .prompt import ChatTemplate, render_prompt
from .request_errors import RequestError, invalid_argument
from .sampling import settings_from_proto

__all__ = ["check_model_name", "prepare_request"]

MAX_REQUEST_ID_CHARS = 256
MAX_PARTITION_KEY_CHARS = 256


def check_model_name(requested: str, info: ModelInfo) -> None:
    if requested and requested not in (info.model_id, info.source):
        raise RequestError(
            grpc.StatusCode.NOT_FOUND,
            f"model {requested!r} is not served here; this engine serves {info.model_id!r}",
            field="model",
        )


def prepare_request(
    request: pb.GenerateRequest,
    *,
    kind: JobKind,
    info: ModelInfo,
    template: ChatTemplate | None,
    grammar: GrammarCompiler | None = None,
) -> PreparedRequest:
    """Validate and render; raises RequestError with the status code the caller should see."""
    check_model_name(request.model, info)
    if len(request.request_id) > MAX_REQUEST_ID_CHARS:
        raise invalid_argument(
            f"request_id is longer than {MAX_REQUEST_ID_CHARS} characters", field="request_id"
        )
    request_id = request.request_id or f"req_{uuid.uuid4().hex}"
    if len(request.partition_key) > MAX_PARTITION_KEY_CHARS:
        raise invalid_argument(
            f"partition_key is longer than {MAX_PARTITION_KEY_CHARS} characters", field="partition_key"
        )
    if template is None:
        raise RequestError(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"model {info.model_id!r} has no chat template, so it cannot take a conversation",
        )
    settings = settings_from_proto(request.sampling, max_tokens_cap=info.max_output_tokens)
    rendered = render_prompt(
        request.messages,
        template=template,
        tools=request.tools,
        tool_choice=request.tool_choice if request.HasField("tool_choice") else None,
        response_format=request.response_format if request.HasField("response_format") else None,
        tool_call_format=info.tool_call_format,
    )
    if len(rendered.images) > info.max_images_per_request:
        raise invalid_argument(
            f"the request has {len(rendered.images)} images; this engine takes at most "
            f"{info.max_images_per_request} per request",
            field="messages",
        )
    images = []
    for image in rendered.images:
        try:
            images.append(
                decode_image(
                    image.part.data,
                    declared_media_type=image.part.media_type or None,
                    limits=info.image_limits,
                )
            )
        except ImageError as error:
            raise invalid_argument(
                f"{image.where}: {error.reason}", field=f"{image.where}.image.data"
            ) from None
    parallel = request.parallel_tool_calls if request.HasField("parallel_tool_calls") else True
    max_calls = request.max_tool_calls if request.HasField("max_tool_calls") else None
    tool_mode = "none" if max_calls == 0 else rendered.tool_mode
    if max_calls == 0 and rendered.tool_mode in ("required", "function"):
        raise invalid_argument("max_tool_calls is 0 but tool_choice requires a call", field="max_tool_calls")
    constraint = None
    if grammar is not None and kind is JobKind.GENERATE:
        constraint = constraint_for(
            grammar,
            tool_call_format=info.tool_call_format,
            tools=request.tools,
            tool_mode=tool_mode,
            forced_name=rendered.forced_name,
            parallel_tool_calls=parallel,
            max_tool_calls=max_calls,
            response_format=request.response_format if request.HasField("response_format") else None,
        )
    return PreparedRequest(
        request_id=request_id,
        kind=kind,
        prompt_text=rendered.text,
        images=tuple(images),
        settings=settings,
        tool_call_format=info.tool_call_format if tool_mode != "none" else "",
        parallel_tool_calls=parallel,
        max_tool_calls=max_calls,
        constraint=constraint,
        partition_key=request.partition_key,
    )
