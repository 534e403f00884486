"""Client library for the vlmserve engine (gRPC).

    from vlmserve.client import EngineClient
    with EngineClient("127.0.0.1:50051") as engine:
        result = engine.generate_unary(request, lower=True)

`lower=True` applies the same image follow-up lowering the REST facade applies
(`vlmserve.responses.lower_messages`), so images in tool outputs and in
assistant/system/developer turns reach the model as a following user turn.
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
