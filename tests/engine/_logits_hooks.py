"""Test-only logits processors on a request, for tests that act at an exact token (a join, a
cancel) or record the logits a row sampled from.

The production request has no such hook: a test marks a request with `with_hooks` (a
`PreparedRequest` subclass, kept through `dataclasses.replace`), and `install` (the autouse
`logits_hooks` fixture in conftest.py; bench/kv_quantization.py calls it itself) has every row
append the hooks of its request to its own processors (after the grammar's), where the sampler
applies them. A hooked row takes no drafts: a hook sees each token
once, before it is drawn.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import pytest

from vlmserve.engine.jobs import PreparedRequest
from vlmserve.engine.loop.draw import LogitsProcessor, TokenDraw

__all__ = ["HookedRequest", "hooks_of", "install", "with_hooks"]


@dataclasses.dataclass(frozen=True, slots=True)
class HookedRequest(PreparedRequest):
    # Applied in order after the request's own processors, on the generation thread.
    hooks: tuple[LogitsProcessor, ...] = ()


def hooks_of(request: PreparedRequest) -> tuple[LogitsProcessor, ...]:
    return request.hooks if isinstance(request, HookedRequest) else ()


def with_hooks(request: PreparedRequest, *hooks: LogitsProcessor, **changes: Any) -> HookedRequest:
    """`request` (with `changes`) whose row also runs `hooks`, after any it has already."""
    fields = {field.name: getattr(request, field.name) for field in dataclasses.fields(PreparedRequest)}
    return HookedRequest(**{**fields, **changes}, hooks=(*hooks_of(request), *hooks))


def install(monkeypatch: pytest.MonkeyPatch) -> None:
    built: Callable[[TokenDraw, int], list[LogitsProcessor]] = TokenDraw.new_logits_processors

    def with_request_hooks(draw: TokenDraw, max_tokens: int) -> list[LogitsProcessor]:
        return [*built(draw, max_tokens), *hooks_of(draw.request)]

    monkeypatch.setattr(TokenDraw, "new_logits_processors", with_request_hooks)
