"""Optional API keys for the facade: `Authorization: Bearer <key>` or `x-api-key: <key>` (how
Anthropic's clients send it), checked in constant time.

The keys are the settings' `ApiKeys` (settings/api_keys.py: `VLMSERVE_API_KEYS` and/or the file
named by `VLMSERVE_API_KEYS_FILE`). With no key configured, authentication is off and every
caller is the owner "anonymous" (the facade binds 127.0.0.1 by default).

`require_owner` is the FastAPI dependency: it answers 401 (OpenAI-shaped) or returns the caller's
owner id, a truncated SHA-256 of the key, so stored responses can belong to the key that made them
without the key itself being stored. `create_app` attaches it to every router except the one
holding `/healthz`; routes that need the owner read it with `owner_of(request)`. `/metrics`
takes `require_operator` instead: an operator key, never a client's (its figures count every key).
Keys are held only as digests; the presented key is hashed once and compared with every digest,
with no early exit, so the time taken says nothing about which key matched or how close a guess is.
"""

from __future__ import annotations

from fastapi import FastAPI, Request
from starlette.requests import HTTPConnection

from vlmserve.facade.http.errors import APIError
from vlmserve.facade.settings.api_keys import OPERATOR_KEYS_ENV, ApiKeys

__all__ = [
    "ANONYMOUS_OWNER",
    "authenticate",
    "install_api_keys",
    "owner_of",
    "require_operator",
    "require_owner",
]

ANONYMOUS_OWNER = "anonymous"


def owner_of(request: Request) -> str:
    """Whose stored objects a request may see; `require_owner` (or the Anthropic routes' own
    dependency) sets it."""
    return str(getattr(request.state, "owner", ""))


def install_api_keys(app: FastAPI, keys: ApiKeys, operator_keys: ApiKeys | None = None) -> None:
    """Make `keys` the ones `require_owner` checks for this app, and `operator_keys` the ones
    `require_operator` checks (call once, at app creation)."""
    app.state.api_keys = keys
    app.state.operator_keys = operator_keys or ApiKeys()


_CHALLENGE = {"WWW-Authenticate": "Bearer"}


def _missing_key() -> APIError:
    return APIError(
        401,
        "You didn't provide an API key. Provide it in an Authorization header using Bearer auth "
        "(Authorization: Bearer YOUR_KEY), or in an x-api-key header.",
        headers=_CHALLENGE,
    )


def _incorrect_key() -> APIError:
    # Never echo what was presented: it may be a real key for another service.
    return APIError(401, "Incorrect API key provided.", code="invalid_api_key", headers=_CHALLENGE)


async def require_owner(request: Request) -> str:
    """FastAPI dependency: the caller's owner id, or 401. Fails closed if keys were not installed.

    The owner is also left in `request.state.owner`, where `owner_of` reads it.
    """
    owner = authenticate(request)
    request.state.owner = owner
    return owner


def authenticate(request: HTTPConnection) -> str:
    """The owner id of an HTTP request or a WebSocket handshake, or the 401 APIError."""
    keys = getattr(request.app.state, "api_keys", None)
    if not isinstance(keys, ApiKeys):
        raise RuntimeError("install_api_keys(app, ...) was not called")  # a 500, never an open door
    if not keys.enabled:
        return ANONYMOUS_OWNER
    bearer = request.headers.getlist("authorization")
    api_key = request.headers.getlist("x-api-key")
    if not bearer and not api_key:
        raise _missing_key()
    presented: list[str] = []
    if bearer:
        scheme, _, key = bearer[0].partition(" ")
        if len(bearer) != 1 or scheme.lower() != "bearer" or not key.strip():
            raise _incorrect_key()
        presented.append(key.strip())
    if api_key:
        if len(api_key) != 1 or not api_key[0].strip():
            raise _incorrect_key()
        presented.append(api_key[0].strip())
    # Both headers: both must be ours and the same key's (never one key's owner for another's).
    owners = {keys.owner_for_key(key) for key in presented}
    if len(owners) != 1 or None in owners:
        raise _incorrect_key()
    owner = owners.pop()
    assert owner is not None
    return owner


async def require_operator(request: Request) -> None:
    """FastAPI dependency for the operator's routes (`/metrics`): with API keys on, only an
    operator key (`$VLMSERVE_OPERATOR_KEYS`) passes; a client's key is a 403, since the
    figures there count every key's traffic. With API keys off, everyone passes."""
    keys = getattr(request.app.state, "api_keys", None)
    operators = getattr(request.app.state, "operator_keys", None)
    if not isinstance(keys, ApiKeys) or not isinstance(operators, ApiKeys):
        raise RuntimeError("install_api_keys(app, ...) was not called")
    if not keys.enabled and not operators.enabled:
        return
    headers = request.headers.getlist("authorization")
    if not headers:
        raise _missing_key()
    scheme, _, key = headers[0].partition(" ")
    if len(headers) != 1 or scheme.lower() != "bearer" or not key.strip():
        raise _incorrect_key()
    if operators.owner_for_key(key.strip()) is not None:
        return
    if keys.owner_for_key(key.strip()) is None:
        raise _incorrect_key()
    raise APIError(
        403,
        "This route is for the server's operator: it needs an operator key ($"
        + OPERATOR_KEYS_ENV
        + "), not an API key.",
        code="permission_denied",
    )
