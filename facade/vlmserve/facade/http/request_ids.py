"""An id for every HTTP request: in the `x-request-id` answer header (as OpenAI sends one, which
the openai SDK exposes as `_request_id`) and on every log line written while serving it."""

from __future__ import annotations

import uuid

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from vlmserve.server.logs import bind

HEADER = b"x-request-id"


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

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (HEADER, request_id.encode())]
            await send(message)

        with bind(request_id=request_id):
            await self.app(scope, receive, sending)
