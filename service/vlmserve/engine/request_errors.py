"""Request errors carried from any layer of the engine to a gRPC status code."""

from __future__ import annotations

import grpc


class RequestError(Exception):
    """A request the engine refuses or cannot finish; `code` becomes the call's gRPC status.

    `message` is shown to the client as is: it names the rule or the limit, never internals.
    """

    def __init__(self, code: grpc.StatusCode, message: str) -> None:
        super().__init__(message)
        self.code = code
        self.message = message

    def __repr__(self) -> str:
        return f"RequestError({self.code.name}, {self.message!r})"


def invalid_argument(message: str) -> RequestError:
    return RequestError(grpc.StatusCode.INVALID_ARGUMENT, message)
