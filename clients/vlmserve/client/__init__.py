"""Client library for the vlmserve engine (gRPC).

    from vlmserve.client import EngineClient
    with EngineClient("127.0.0.1:50051") as engine:
        result = engine.generate_unary(request)

Requests go as they are: the engine itself applies the image follow-up lowering (images in tool
outputs and in assistant/system/developer turns reach the model as a following user turn), so
gRPC callers get exactly what REST callers get. Failures raise `EngineError` subclasses carrying
the engine's structured details (`field`, `field_violations`, `retry_after_s`).
"""

from ._aio import AsyncEngineClient, text_of
from ._errors import (
    AbortedError,
    CancelledError,
    DeadlineExceededError,
    EngineError,
    FailedPreconditionError,
    FieldViolation,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    OutOfRangeError,
    PermissionDeniedError,
    ResourceExhaustedError,
    UnauthenticatedError,
    UnavailableError,
    UnimplementedError,
    from_rpc_error,
)
from ._options import ENGINE_SERVICE_NAME, MAX_MESSAGE_BYTES, Deadlines, channel_options, server_options
from ._sync import EngineClient

__all__ = [
    "ENGINE_SERVICE_NAME",
    "MAX_MESSAGE_BYTES",
    "AbortedError",
    "AsyncEngineClient",
    "CancelledError",
    "DeadlineExceededError",
    "Deadlines",
    "EngineClient",
    "EngineError",
    "FailedPreconditionError",
    "FieldViolation",
    "InternalError",
    "InvalidArgumentError",
    "NotFoundError",
    "OutOfRangeError",
    "PermissionDeniedError",
    "ResourceExhaustedError",
    "UnauthenticatedError",
    "UnavailableError",
    "UnimplementedError",
    "channel_options",
    "from_rpc_error",
    "server_options",
    "text_of",
]
