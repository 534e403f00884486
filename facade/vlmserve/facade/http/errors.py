"""OpenAI-shaped errors for every failure the facade can answer with.

Each error body is `{"error": {"message", "type", "param", "code"}}`. Messages are written here
(or by the translation, which guarantees the same): never an exception's text, never base64.
4xx errors are `invalid_request_error` (OpenAI's type for them); 5xx are `server_error`.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

import grpc
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from vlmserve.anthropic import anthropic_status, error_body
from vlmserve.client import EngineError
from vlmserve.responses import ErrorPayload, InvalidRequestError

logger = logging.getLogger("vlmserve.facade")
E = TypeVar("E", bound=Exception)

# Engine details are our own engine's words, but bound them so nothing unexpected is echoed at length.
_MAX_DETAILS_CHARS = 500
# Contract field path (the engine's BadRequest field violation) -> the Responses request field it
# comes from. Messages are the whole conversation (instructions, replay and input together) and
# tools leave out hosted tools, so indexes do not carry over: those name the list.
_PARAM_FOR_ENGINE_FIELD: tuple[tuple[str, str], ...] = (
    ("messages", "input"),
    ("tools", "tools"),
    ("tool_choice", "tool_choice"),
    ("parallel_tool_calls", "parallel_tool_calls"),
    ("max_tool_calls", "max_tool_calls"),
    ("sampling.max_tokens", "max_output_tokens"),
    ("sampling.temperature", "temperature"),
    ("sampling.top_p", "top_p"),
    ("sampling.top_k", "top_k"),
    ("sampling.stop", "stop"),
    ("sampling.top_logprobs", "top_logprobs"),
    ("response_format.json_schema.schema_json", "text.format.schema"),
    ("response_format.json_schema.name", "text.format.name"),
    ("response_format", "text.format"),
    ("model", "model"),
)


class APIError(Exception):
    """An error the facade answers with; raise it anywhere below a route."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        type: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.type = type or ("invalid_request_error" if status < 500 else "server_error")
        self.headers = dict(headers or {})

    def payload(self) -> ErrorPayload:
        """The inner object: what an SSE `error` event carries too."""
        return ErrorPayload(message=self.message, type=self.type, param=self.param, code=self.code)

    def renamed(self, rename: Callable[[str], str]) -> APIError:
        """The same error naming fields by `rename` (another API's path map), as
        `InvalidRequestError.renamed` does (one rule for both)."""
        renamed = InvalidRequestError(self.message, param=self.param, code=self.code).renamed(rename)
        return APIError(
            self.status,
            renamed.message,
            param=renamed.param,
            code=self.code,
            type=self.type,
            headers=self.headers,
        )

    def to_response(self) -> JSONResponse:
        return JSONResponse(
            {"error": self.payload().to_json()}, status_code=self.status, headers=self.headers
        )


def not_found(kind: str, identifier: str, *, param: str | None = None) -> APIError:
    # The id is the client's own string; json.dumps quotes and escapes it.
    return APIError(
        404, f"No {kind} found with id {json.dumps(identifier)[:200]}.", param=param, code="not_found"
    )


def previous_response_not_found(identifier: str) -> APIError:
    """A `previous_response_id` that names nothing this owner (or this WebSocket connection) has:
    OpenAI's 400 and code, which Codex and the SDKs look for to start the chain over."""
    return APIError(
        400,
        f"Previous response with id {json.dumps(identifier)[:200]} not found.",
        param="previous_response_id",
        code="previous_response_not_found",
    )


def model_not_found(model: str, *, served: Sequence[str] = ()) -> APIError:
    names = ", ".join(json.dumps(name) for name in served)
    return APIError(
        404,
        f"The model {json.dumps(model)[:200]} does not exist. "
        + (f"This server serves {names[:1000]} (see GET /v1/models)." if served else "See GET /v1/models."),
        param="model",
        code="model_not_found",
    )


def request_too_large_for_engine() -> APIError:
    return APIError(
        413,
        "The request, with the earlier turns it continues, is larger than the engine accepts; "
        "send fewer or smaller images, or start a new conversation.",
        param="input",
        code="request_too_large",
    )


def from_invalid_request(error: InvalidRequestError) -> APIError:
    return APIError(error.status, error.message, param=error.param, code=error.code)


@contextlib.contextmanager
def fields_renamed(rename: Callable[[str], str]) -> Iterator[None]:
    """Errors of the shared Responses translation (and the engine's) naming another API's fields:
    `rename` is that request's path map (`ChatRequest.chat_param`, `MessagesRequest.anthropic_param`)."""
    try:
        yield
    except InvalidRequestError as error:
        raise from_invalid_request(error.renamed(rename)) from None
    except APIError as error:
        raise error.renamed(rename) from None


def param_for_engine_field(field: str | None) -> str | None:
    """The Responses `param` for the contract field an engine error names (None: not one we send)."""
    if not field:
        return None
    for prefix, param in _PARAM_FOR_ENGINE_FIELD:
        if field == prefix or field.startswith((f"{prefix}.", f"{prefix}[")):
            return param
    return None


# A contract field the engine names -> (its contract part path, the client's path of that part),
# for a part of the request's input (`TranslatedRequest.engine_part_path`); None: not one.
PartPath = Callable[[str], "tuple[str, str] | None"]


def from_engine_error(
    error: EngineError,
    *,
    context_length: int | None = None,
    retry_after_s: int = 1,
    part_path: PartPath | None = None,
) -> APIError:
    """The HTTP answer for a failed engine call, from its status code and structured details.
    `part_path`: a refused part of the input (a clip its family cannot take, an image or clip over
    a limit) is named as the client wrote it, not by its place in the contract request."""
    details = (error.details or "")[:_MAX_DETAILS_CHARS]
    code = error.code
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        found = part_path(error.field) if part_path is not None and error.field else None
        if found is not None:
            contract, client = found
            message = details.replace(contract, f"Invalid value for '{client}'", 1)
            if message == details:
                message = f"Invalid value for '{client}': {details}"
            return APIError(400, message, param=client, code="invalid_value")
        return APIError(
            400,
            details or "The engine refused the request.",
            param=param_for_engine_field(error.field),
            code="invalid_value",
        )
    if code == grpc.StatusCode.OUT_OF_RANGE:
        limit = f" of {context_length} tokens" if context_length else ""
        said = f" ({details})" if details else ""
        return APIError(
            400,
            f"The input is longer than the model's context window{limit}{said}. Shorten the input.",
            param="input",
            code="context_length_exceeded",
        )
    if code == grpc.StatusCode.NOT_FOUND:
        return APIError(
            404, details or "Not found.", param=param_for_engine_field(error.field), code="not_found"
        )
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED and error.retry_after_s is None:
        # The engine's full queue says when to retry (RetryInfo); without it this is gRPC's own
        # message-size limit, either side of the channel, which no retry would help.
        return request_too_large_for_engine()
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return APIError(
            503,
            "The engine is at capacity; retry shortly.",
            code="engine_overloaded",
            headers={"Retry-After": str(retry_after_s)},
        )
    if code == grpc.StatusCode.UNAVAILABLE:
        # A loading model says when to come back (RetryInfo); a dead engine says nothing.
        headers = {"Retry-After": str(max(1, math.ceil(error.retry_after_s)))} if error.retry_after_s else {}
        return APIError(503, "The engine is unavailable.", code="engine_unavailable", headers=headers)
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return APIError(504, "The engine did not answer in time.", code="engine_timeout")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return APIError(501, details or "Not supported by this engine.", code="unsupported")
    if code == grpc.StatusCode.CANCELLED:
        return APIError(499, "The request was cancelled.", code="cancelled")
    if code == grpc.StatusCode.ABORTED:
        # The engine stopped constrained output it could no longer keep to its grammar (a
        # runtime limit): the output is not what was asked for, never a silent success.
        said = f" ({details})" if details else ""
        return APIError(
            500,
            f"The output could not be kept to its required format{said}.",
            code="constrained_decoding_failed",
        )
    logger.error("engine call failed: %s", error.code.name)
    return APIError(502, "The engine failed to process the request.", code="engine_error")


def _param_from_location(location: Sequence[int | str]) -> str | None:
    """FastAPI's `("query", "limit")` -> `limit`; a body path -> `input[2].type` style."""
    parts = list(location)
    if parts and parts[0] in ("query", "path", "header", "body", "cookie"):
        parts = parts[1:]
    param = ""
    for part in parts:
        if isinstance(part, str):
            # A repeated query parameter's alias (`include[]`): its index follows.
            part = part.removesuffix("[]")
        param += f"[{part}]" if isinstance(part, int) else (f".{part}" if param else str(part))
    return param or None


ANTHROPIC_PATH = "/v1/messages"


def anthropic_shaped(request: Request) -> bool:
    """Errors in Anthropic's shape: on the Messages routes, and for Anthropic's clients elsewhere
    (`/v1/models`; they send `anthropic-version` on every request)."""
    path = request.url.path
    return (
        path == ANTHROPIC_PATH
        or path.startswith(ANTHROPIC_PATH + "/")
        or "anthropic-version" in request.headers
    )


def respond(request: Request, error: APIError) -> JSONResponse:
    """The error as the client's API shapes it."""
    if anthropic_shaped(request):
        return JSONResponse(
            error_body(error.status, error.code, error.message),
            status_code=anthropic_status(error.status, error.code),
            headers=error.headers,
        )
    return error.to_response()


async def _api_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, APIError)
    return respond(request, exc)


async def _invalid_request_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidRequestError)
    return respond(request, from_invalid_request(exc))


async def _validation_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    errors = exc.errors()
    first: Mapping[str, Any] = errors[0] if errors else {}
    if first.get("type") == "json_invalid":
        return respond(request, APIError(400, "The request body is not valid JSON.", code="invalid_json"))
    param = _param_from_location(first.get("loc", ()))
    # pydantic's `msg` describes the constraint ("Input should be less than or equal to 100"); it
    # never contains the rejected value, unlike `input`, which is deliberately left out.
    message = (
        f"Invalid value for '{param}': {first.get('msg', 'invalid value')}." if param else "Invalid request."
    )
    return respond(request, APIError(400, message, param=param, code="invalid_value"))


async def _http_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 404:
        message, code = "Unknown URL or resource.", "not_found"
    elif exc.status_code == 405:
        message, code = "Method not allowed for this URL.", "method_not_allowed"
    else:
        message, code = (str(exc.detail) if isinstance(exc.detail, str) else "Request failed."), None
    return respond(request, APIError(exc.status_code, message, code=code, headers=exc.headers))


async def _engine_error_handler(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, EngineError)
    state = getattr(request.app.state, "facade", None)
    retry_after_s = state.settings.retry_after_s if state is not None else 1
    return respond(request, from_engine_error(exc, retry_after_s=retry_after_s))


def insufficient_storage(what: str = "this request") -> APIError:
    """507: the server is out of storage space (the store's `OutOfSpaceError`, a full disk)."""
    return APIError(
        507,
        f"The server is out of storage space; {what} was not stored. Retry later.",
        code="insufficient_storage",
        type="server_error",
    )


# An error the handlers do not know that the app does (a full disk: 507): its APIError, else None.
ErrorClassifier = Callable[[Exception], "APIError | None"]


def _unexpected_error_handler(
    classify: ErrorClassifier,
) -> Callable[[Request, Exception], Awaitable[JSONResponse]]:
    async def handle(request: Request, exc: Exception) -> JSONResponse:
        known = classify(exc)
        if known is not None:
            # The operator's to fix (a full disk), not a bug: its status, one warning line.
            logger.warning("%s: %s", known.code, type(exc).__name__)
            return respond(request, known)
        # Logged with its traceback for us; the client gets no internal text.
        logger.exception("unhandled error", exc_info=exc)
        return respond(
            request,
            APIError(500, "The server had an error while processing the request.", code="server_error"),
        )

    return handle


def map_error(app: FastAPI, kind: type[E], to_api_error: Callable[[E], APIError]) -> None:
    """Answer a lower floor's exception (`kind`, which knows no HTTP) as `to_api_error` says."""

    async def handle(request: Request, exc: Exception) -> JSONResponse:
        assert isinstance(exc, kind)
        return respond(request, to_api_error(exc))

    app.add_exception_handler(kind, handle)


def install_error_handlers(app: FastAPI, *, classify: ErrorClassifier = lambda _: None) -> None:
    app.add_exception_handler(APIError, _api_error_handler)
    app.add_exception_handler(InvalidRequestError, _invalid_request_handler)
    app.add_exception_handler(RequestValidationError, _validation_handler)
    app.add_exception_handler(StarletteHTTPException, _http_error_handler)
    app.add_exception_handler(EngineError, _engine_error_handler)
    app.add_exception_handler(Exception, _unexpected_error_handler(classify))
