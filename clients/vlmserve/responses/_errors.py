"""The one error type translation raises: an OpenAI-shaped 400 with a JSON path."""

from __future__ import annotations

from collections.abc import Callable


class InvalidRequestError(Exception):
    """A client error in a Responses request, with the JSON path of the offending field.

    `message` is safe to show to the client: it never echoes base64 payloads or the text of
    an underlying exception. `quoted`: the other field paths the message names (besides
    `param`), so that an API translated into this one can rename each by its path.
    """

    def __init__(
        self,
        message: str,
        *,
        param: str | None = None,
        code: str | None = "invalid_value",
        status: int = 400,
        quoted: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.message = message
        self.param = param
        self.code = code
        self.status = status
        self.quoted = quoted

    def renamed(self, rename: Callable[[str], str]) -> InvalidRequestError:
        """The same error with `param` and every path the message quotes renamed by `rename`
        (a path map from another API's request): paths are replaced as the known strings they
        are, the rest of the message is left alone."""
        message = self.message
        for path in (self.param, *self.quoted):
            if path:
                message = message.replace(f"'{path}'", f"'{rename(path)}'")
        return InvalidRequestError(
            message,
            param=rename(self.param) if self.param else self.param,
            code=self.code,
            status=self.status,
            quoted=tuple(rename(path) for path in self.quoted),
        )

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
