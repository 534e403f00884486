"""Typed errors mapped from gRPC status codes."""

from __future__ import annotations

import grpc

__all__ = [
    "AbortedError",
    "CancelledError",
    "DeadlineExceededError",
    "EngineError",
    "FailedPreconditionError",
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


class EngineError(Exception):
    """An engine call failed; `code` is the gRPC status, `details` the engine's message."""

    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, details: str, *, code: grpc.StatusCode | None = None) -> None:
        super().__init__(details)
        self.details = details
        if code is not None:
            self.code = code

    def __str__(self) -> str:
        return f"{self.code.name}: {self.details}"


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


def from_rpc_error(error: grpc.RpcError) -> EngineError:
    """The typed error for a failed call (grpc.RpcError and grpc.aio.AioRpcError alike)."""
    code_fn = getattr(error, "code", None)
    details_fn = getattr(error, "details", None)
    code = code_fn() if callable(code_fn) else grpc.StatusCode.UNKNOWN
    details = (details_fn() if callable(details_fn) else None) or str(code.name if code else "UNKNOWN")
    cls = _BY_CODE.get(code, EngineError)
    return cls(details, code=code)
