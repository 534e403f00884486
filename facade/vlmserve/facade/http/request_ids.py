"""An id for every HTTP request: in the `x-request-id` answer header (as OpenAI sends one, which
the openai SDK exposes as `_request_id`) and on every log line written while serving it. An
Anthropic answer (`/v1/messages…`, or any request from an Anthropic client, which sends
`anthropic-version`) also carries it as `request-id`, Anthropic's name for it (the anthropic SDK's
`_request_id`)."""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vlmserve.server.logs import bind

HEADER = b"x-request-id"
ANTHROPIC_HEADER = b"request-id"
_ANTHROPIC_PATH = "/v1/messages"


def _anthropic(scope: Scope) -> bool:
    path: str = scope.get("path", "")
    if path == _ANTHROPIC_PATH or path.startswith(_ANTHROPIC_PATH + "/"):
        return True
    return any(name == b"anthropic-version" for name, _ in scope.get("headers", ()))


def new_request_id() -> str:
    return f"req_{uuid.uuid4().hex}"


class RequestIds:
    """ASGI middleware. The id is always ours: a client's header is not trusted into the logs."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        request_id = new_request_id()
        names = (HEADER, ANTHROPIC_HEADER) if _anthropic(scope) else (HEADER,)

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                ids = [(name, request_id.encode()) for name in names]
                message["headers"] = [*message.get("headers", []), *ids]
            await send(message)

        with bind(request_id=request_id):
            await self.app(scope, receive, sending)
