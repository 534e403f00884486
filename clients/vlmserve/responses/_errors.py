"""The one error type translation raises: an OpenAI-shaped 400 with a JSON path."""

from __future__ import annotations


class InvalidRequestError(Exception):
    """A client error in a Responses request, with the JSON path of the offending field.

    `message` is safe to show to the client: it never echoes base64 payloads or the text of
    an underlying exception.
    """

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = "invalid_value",
        status: int = 400,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status

    def to_json(self) -> dict[str, object]:
        """The OpenAI error body: `{"error": {type, code, param, message}}`."""
        return {
            "error": {
                "type": "invalid_request_error",
                "code": self.code,
                "param": self.param,
                "message": self.message,
            }
        }

    def __repr__(self) -> str:
        return f"InvalidRequestError({self.message!r}, param={self.param!r}, code={self.code!r})"
