"""Typed errors mapped from gRPC status codes and the engine's structured details."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import grpc
from google.rpc import error_details_pb2
from grpc_status import rpc_status

__all__ = [
    "AbortedError",
    "CancelledError",
    "DeadlineExceededError",
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
    "from_rpc_error",
]


@dataclass(frozen=True, slots=True)
class FieldViolation:
    """One request field the engine refused (google.rpc.BadRequest.FieldViolation)."""

    # The contract field path, e.g. "messages[2].parts[0]" or "sampling.top_p".
    field: str
    description: str


class EngineError(Exception):
    """An engine call failed; `code` is the gRPC status, `details` the engine's message.

    The engine's own errors also carry structured details (google.rpc.Status):
    `field_violations` (and `field`, the first one's path) when the request was at fault, and
    `retry_after_s` when retrying later can succeed (a full queue; None on gRPC's own errors,
    such as its message-size limit, which shares RESOURCE_EXHAUSTED with a full queue).
    """

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(
        self,
        details: str,
        *,
        code: grpc.StatusCode | None = None,
        field_violations: Sequence[FieldViolation] = (),
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(details)
        self.details = details
        if code is not None:
            self.code = code
        self.field_violations = tuple(field_violations)
        self.retry_after_s = retry_after_s

    @property
    def field(self) -> str | None:
        """The path of the (first) request field at fault, if the engine named one."""
        return self.field_violations[0].field if self.field_violations else None

    def __str__(self) -> str:
        where = f" [{self.field}]" if self.field else ""
        return f"{self.code.name}{where}: {self.details}"


class InvalidArgumentError(EngineError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class OutOfRangeError(EngineError):
    code = grpc.StatusCode.OUT_OF_RANGE


class NotFoundError(EngineError):
    code = grpc.StatusCode.NOT_FOUND


class FailedPreconditionError(EngineError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class ResourceExhaustedError(EngineError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class UnavailableError(EngineError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceededError(EngineError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class CancelledError(EngineError):
    code = grpc.StatusCode.CANCELLED


class AbortedError(EngineError):
    code = grpc.StatusCode.ABORTED


class UnauthenticatedError(EngineError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDeniedError(EngineError):
    code = grpc.StatusCode.PERMISSION_DENIED


class UnimplementedError(EngineError):
    code = grpc.StatusCode.UNIMPLEMENTED


class InternalError(EngineError):
    code = grpc.StatusCode.INTERNAL


_BY_CODE: dict[grpc.StatusCode, type[EngineError]] = {
    cls.code: cls
    for cls in (
        InvalidArgumentError,
        OutOfRangeError,
        NotFoundError,
        FailedPreconditionError,
        ResourceExhaustedError,
        UnavailableError,
        DeadlineExceededError,
        CancelledError,
        AbortedError,
        UnauthenticatedError,
        PermissionDeniedError,
        UnimplementedError,
        InternalError,
    )
}


def _rich_status(error: grpc.RpcError) -> Any:
    """The call's google.rpc.Status, or None (no details, or details that do not match the call)."""
    if not callable(getattr(error, "trailing_metadata", None)):
        return None
    try:
        return rpc_status.from_call(error)
    except ValueError:
        return None


def _structured(status: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    if status is None:
        return found
    bad_request = error_details_pb2.BadRequest()
    retry = error_details_pb2.RetryInfo()
    for detail in status.details:
        if detail.Is(bad_request.DESCRIPTOR) and detail.Unpack(bad_request):
            found["field_violations"] = [
                FieldViolation(field=violation.field, description=violation.description)
                for violation in bad_request.field_violations
            ]
        elif detail.Is(retry.DESCRIPTOR) and detail.Unpack(retry):
            found["retry_after_s"] = retry.retry_delay.ToNanoseconds() / 1e9
    return found


def from_rpc_error(error: grpc.RpcError) -> EngineError:
    """The typed error for a failed call (grpc.RpcError and grpc.aio.AioRpcError alike)."""
    code_fn = getattr(error, "code", None)
    details_fn = getattr(error, "details", None)
    code = code_fn() if callable(code_fn) else grpc.StatusCode.UNKNOWN
    details = (details_fn() if callable(details_fn) else None) or str(code.name if code else "UNKNOWN")
    cls = _BY_CODE.get(code, EngineError)
    return cls(details, code=code, **_structured(_rich_status(error)))
