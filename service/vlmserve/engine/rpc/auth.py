"""Who may call the engine: an optional shared token, and optional TLS / mutual TLS.

* `TokenAuthInterceptor`: every call must carry `authorization: Bearer <token>` metadata matching
  one of the configured tokens (several allow rotation), compared in constant time. Otherwise the
  call ends with UNAUTHENTICATED before any handler runs or any request message is parsed; unknown
  methods get the same answer, so an unauthenticated caller learns nothing about the API.
  Health `Check`/`Watch` are exempt: liveness/readiness probes (kubelet gRPC probes,
  grpc_health_probe) cannot send a token, and health reveals only SERVING / NOT_SERVING.
  Reflection is not exempt: it describes the whole API.
* `server_credentials`: TLS from PEM files; with a client CA, mutual TLS (client certificate
  required and verified).
* `EngineSecurity` bundles both as the engine's settings (flags and variables declared there:
  the token from a file or the environment, never from the command line, where `ps` would show
  it); `check_address()` refuses a non-local address with no authentication, `interceptors()` and
  `add_port()` apply them.

No mlx here: this module imports only grpc and pydantic, so it is cheap to test and to reuse.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Sequence
from pathlib import Path
from typing import Annotated, Any, ClassVar, TypeVar

import grpc
from pydantic import BeforeValidator, Field, field_validator, model_validator

from vlmserve.server.netaddr import is_loopback_host
from vlmserve.server.secrets import digest, matches_any, read_secret_file
from vlmserve.server.settings import DeclaredSettings, Option

__all__ = [
    "HEALTH_METHODS",
    "MIN_TOKEN_CHARS",
    "TOKEN_ENV",
    "EngineSecurity",
    "TokenAuthInterceptor",
    "is_local_address",
    "server_credentials",
]

TOKEN_ENV = "VLMSERVE_ENGINE_TOKEN"
MIN_TOKEN_CHARS = 16
HEALTH_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})
_UNAUTHENTICATED_DETAILS = "Missing or invalid engine token."
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


def _checked_tokens(tokens: Iterable[str]) -> tuple[str, ...]:
    checked = tuple(token.strip() for token in tokens if token.strip())
    if not checked:
        raise ValueError("no engine token given")
    for token in checked:
        if len(token) < MIN_TOKEN_CHARS:
            raise ValueError(f"engine tokens must be at least {MIN_TOKEN_CHARS} characters")
    return checked


async def _reject(request_or_iterator: object, context: grpc.aio.ServicerContext[Any, Any]) -> None:
    await context.abort(grpc.StatusCode.UNAUTHENTICATED, _UNAUTHENTICATED_DETAILS)


# No deserializer: a refused caller's request bytes are never parsed. A stream-stream handler
# neither waits for nor reads a request, so it answers every kind of call at once.
_REJECTING_HANDLER: grpc.RpcMethodHandler[Any, Any] = grpc.stream_stream_rpc_method_handler(_reject)


class TokenAuthInterceptor(grpc.aio.ServerInterceptor):
    """Requires `authorization: Bearer <token>` on every call except `exempt_methods`."""

    def __init__(self, tokens: Iterable[str], *, exempt_methods: Iterable[str] = HEALTH_METHODS) -> None:
        self._digests = tuple(digest(token) for token in _checked_tokens(tokens))
        self._exempt = frozenset(exempt_methods)

    def authorized(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> bool:
        values = [value for key, value in metadata or () if key.lower() == "authorization"]
        if len(values) != 1 or not isinstance(values[0], str):
            return False
        scheme, _, token = values[0].partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return False
        return matches_any(self._digests, digest(token.strip()))

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Request, _Response] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Request, _Response] | None:
        if handler_call_details.method in self._exempt or self.authorized(
            handler_call_details.invocation_metadata
        ):
            return await continuation(handler_call_details)
        return _REJECTING_HANDLER


def is_local_address(address: str) -> bool:
    """A gRPC bind address only this machine can reach: `unix:`, or a loopback host."""
    if address.startswith(("unix:", "unix-abstract:")):
        return True
    return is_loopback_host(address.rsplit(":", 1)[0])


def server_credentials(
    cert_file: Path, key_file: Path, client_ca_file: Path | None = None
) -> grpc.ServerCredentials:
    """TLS server credentials from PEM files; with `client_ca_file`, mutual TLS: clients must
    present a certificate signed by that CA."""
    certificate_chain = Path(cert_file).read_bytes()
    private_key = Path(key_file).read_bytes()
    client_ca = Path(client_ca_file).read_bytes() if client_ca_file is not None else None
    return grpc.ssl_server_credentials(
        [(private_key, certificate_chain)],
        root_certificates=client_ca,
        require_client_auth=client_ca is not None,
    )


def _token_list(raw: object) -> object:
    return tuple(token for token in raw.split(",") if token.strip()) if isinstance(raw, str) else raw


class EngineSecurity(DeclaredSettings):
    """Authentication: a shared token and/or TLS (loopback and unix sockets may run without)"""

    ENV_PREFIX: ClassVar[str] = "VLMSERVE_ENGINE_"

    tokens: Annotated[tuple[str, ...], Option(flag=None, env=TOKEN_ENV), BeforeValidator(_token_list)] = (
        Field(
            (),
            repr=False,
            description="shared token(s) callers must send as 'authorization: Bearer TOKEN', "
            "comma-separated (several allow rotation); none: no token required",
        )
    )
    auth_token_file: Path | None = Field(
        None, description=f"file of shared tokens, one per line (instead of ${TOKEN_ENV})"
    )
    tls_cert: Path | None = Field(None, description="PEM certificate chain: serve TLS")
    tls_key: Path | None = Field(None, description="PEM private key for --tls-cert")
    tls_client_ca: Path | None = Field(
        None, description="PEM CA bundle: require client certificates (mutual TLS)"
    )

    @model_validator(mode="before")
    @classmethod
    def _read_token_file(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("auth_token_file") is not None:
            tokens = read_secret_file(Path(data["auth_token_file"]))
            if not tokens:
                raise ValueError(f"--auth-token-file: no token in {data['auth_token_file']}")
            data = {**data, "tokens": tuple(tokens)}
        return data

    @field_validator("tokens")
    @classmethod
    def _check_tokens(cls, tokens: tuple[str, ...]) -> tuple[str, ...]:
        return _checked_tokens(tokens) if tokens else ()

    @model_validator(mode="after")
    def _check(self) -> EngineSecurity:
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")
        return self

    @property
    def is_protected(self) -> bool:
        """Whether a caller must prove something (a token or a client certificate)."""
        return bool(self.tokens) or self.tls_client_ca is not None

    def check_address(self, address: str) -> None:
        """Refuse (ValueError) to serve a non-local address with no token and no client certificate:
        anyone who can reach it could use the engine. Unix sockets and loopback are fine."""
        if not self.is_protected and not is_local_address(address):
            raise ValueError(
                f"refusing to serve {address} without authentication: use a unix socket or loopback "
                f"address, or set --auth-token-file / ${TOKEN_ENV} or --tls-client-ca"
            )

    def interceptors(self) -> list[grpc.aio.ServerInterceptor]:
        """Pass to `grpc.aio.server(interceptors=...)`."""
        return [TokenAuthInterceptor(self.tokens)] if self.tokens else []

    def add_port(self, server: grpc.aio.Server, address: str) -> int:
        """Bind `address` with TLS when configured, in the clear otherwise; returns the port."""
        if self.tls_cert is not None and self.tls_key is not None:
            credentials = server_credentials(self.tls_cert, self.tls_key, self.tls_client_ca)
            return int(server.add_secure_port(address, credentials))
        return int(server.add_insecure_port(address))
