"""One create request, whichever API it came in by: its Responses body, typed, and the engine
settings the Responses body has no field for.

Every route parses its body into a `CreateRequest` first (Responses and its WebSocket mode by
`parse_create_request`, chat completions and Anthropic Messages by their own translation), and the
facade's preparation takes only that: what it checks is what it sends, nothing is set on the
engine request after it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel

from vlmserve.engine.v1 import engine_pb2 as pb

from ._request_models import CreateResponseBody, parse_body


@dataclass(frozen=True)
class EngineExtras:
    """Engine settings another API's request has and the Responses body has not (chat's `seed`
    and `stop`, Anthropic's `stop_sequences`, `top_k` and thinking switch)."""

    stop: tuple[str, ...] = ()
    seed: int | None = None
    # 0 or None: the engine's default.
    top_k: int | None = None
    # None: as the Responses body says (`reasoning.effort`), else the template's switch.
    enable_thinking: bool | None = None

    def apply(self, request: pb.GenerateRequest) -> None:
        """Set them on the engine request (last: they win over what the body said)."""
        request.sampling.stop.extend(self.stop)
        if self.seed is not None:
            request.sampling.seed = self.seed
        if self.top_k:
            request.sampling.top_k = self.top_k
        if self.enable_thinking is not None:
            request.enable_thinking = self.enable_thinking


@dataclass(frozen=True)
class CreateRequest:
    """A create request of any API, parsed."""

    body: CreateResponseBody
    extras: EngineExtras = field(default_factory=EngineExtras)
    # `input` as the client sent it (JSON): what is stored and listed. None: the typed body's,
    # dumped (another API's request, translated).
    input_json: Any = None

    def stored_input(self) -> Any:
        """`input` as JSON, as it is stored."""
        return self.input_json if self.input_json is not None else _input_json(self.body)


def parse_create_request(raw: object) -> CreateRequest:
    """Validate a `POST /v1/responses` body (InvalidRequestError naming the field)."""
    body = parse_body(raw)
    assert isinstance(raw, Mapping)  # parse_body refuses anything else
    return CreateRequest(body, input_json=raw["input"])


def _input_json(body: CreateResponseBody) -> Any:
    """A typed body's `input` as JSON (what is stored), dumped once, with only the fields set
    (`serialize_as_any`: by each value's own model, as the tagged unions hold them)."""
    if isinstance(body.input, str):
        return body.input
    return [
        item.model_dump(mode="json", by_alias=True, exclude_unset=True, serialize_as_any=True)
        if isinstance(item, BaseModel)
        else item
        for item in body.input
    ]
