"""Request errors carried from any layer of the engine to a gRPC status with structured details.

A `RequestError` ends the call with `code` and a `google.rpc.Status` (grpcio-status) whose details
say, in a form callers can read without parsing text:
- `BadRequest` with one field violation when the error names the request field at fault
  (`messages[2].parts[0]`, `sampling.top_p`: the contract's field path, AIP-193 style);
- `RetryInfo` when retrying later can succeed (a full queue; RESOURCE_EXHAUSTED without it is
  gRPC's own message-size limit, which no retry helps).
"""

from __future__ import annotations

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

__all__ = ["RequestError", "context_too_long", "internal_error", "invalid_argument"]

# Status messages travel in trailers (twice: grpc-message and the details), which gRPC caps at
# a few KiB; a message quoting a client's 1 MB tool name must not break the call that reports it.
MAX_MESSAGE_CHARS = 1000


class RequestError(Exception):
    """A request the engine refuses or cannot finish; `code` becomes the call's gRPC status.

    `message` is shown to the client as is: it names the rule or the limit, never internals.
    `field`: the request field at fault, for every error the client caused.
    """

    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        field: str | None = None,
        retry_after_s: float | None = None,
    ) -> None:
        if len(message) > MAX_MESSAGE_CHARS:
            message = message[: MAX_MESSAGE_CHARS - 1] + "…"
        super().__init__(message)
        self.code = code
        self.message = message
        self.field = field
        self.retry_after_s = retry_after_s

    def to_status(self) -> grpc.Status:
        """The call's final status, details in `grpc-status-details-bin`."""
        details = []
        if self.field is not None:
            violation = error_details_pb2.BadRequest.FieldViolation
            details.append(
                error_details_pb2.BadRequest(
                    field_violations=[violation(field=self.field, description=self.message)]
                )
            )
        if self.retry_after_s is not None:
            delay = duration_pb2.Duration()
            delay.FromNanoseconds(int(self.retry_after_s * 1e9))
            details.append(error_details_pb2.RetryInfo(retry_delay=delay))
        status = status_pb2.Status(code=self.code.value[0], message=self.message)
        for detail in details:
            packed = any_pb2.Any()
            packed.Pack(detail)
            status.details.append(packed)
        result: grpc.Status = rpc_status.to_status(status)
        return result

    def __repr__(self) -> str:
        return f"RequestError({self.code.name}, {self.message!r}, field={self.field!r})"


def invalid_argument(message: str, *, field: str) -> RequestError:
    """INVALID_ARGUMENT naming the request field at fault (`field` also goes into the details)."""
    return RequestError(grpc.StatusCode.INVALID_ARGUMENT, message, field=field)


def internal_error() -> RequestError:
    """What the client sees for a failure of ours: no exception text, no paths (those go to the log)."""
    return RequestError(grpc.StatusCode.INTERNAL, "the engine failed to process the request")


def context_too_long(tokens: int, context: int, *, at_least: bool = False) -> RequestError:
    """The prompt does not leave room for one generated token (the one place this is said).

    OUT_OF_RANGE, not INVALID_ARGUMENT: the same prompt fits a model with a longer context, and
    callers (the facade) can answer "context length exceeded" precisely."""
    size = f"at least {tokens}" if at_least else str(tokens)
    return RequestError(
        grpc.StatusCode.OUT_OF_RANGE,
        f"the prompt is {size} tokens; the model's context length is {context} tokens, which must "
        "hold the prompt and at least one generated token",
        field="messages",
    )
