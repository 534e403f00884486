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
* `EngineSecurity` bundles both for the engine's CLI: `add_security_arguments` adds the flags,
  `EngineSecurity.from_args` reads them (the token from a file or the environment, never from
  the command line, where `ps` would show it), `check_address()` refuses a non-local address
  with no authentication, `interceptors()` and `add_port()` apply them.

No mlx here: this module imports only grpc, so it is cheap to test and to reuse.
"""

from __future__ import annotations

import argparse
import hashlib
import hmac
import os
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import grpc

from vlmserve.common.netaddr import is_loopback_host

__all__ = [
    "HEALTH_METHODS",
    "MIN_TOKEN_CHARS",
    "TOKEN_ENV",
    "EngineSecurity",
    "TokenAuthInterceptor",
    "add_security_arguments",
    "is_local_address",
    "read_tokens",
    "server_credentials",
]

TOKEN_ENV = "VLMSERVE_ENGINE_TOKEN"
MIN_TOKEN_CHARS = 16
HEALTH_METHODS = frozenset({"/grpc.health.v1.Health/Check", "/grpc.health.v1.Health/Watch"})
_UNAUTHENTICATED_DETAILS = "Missing or invalid engine token."
_Request = TypeVar("_Request")
_Response = TypeVar("_Response")


def _digest(token: str) -> bytes:
    # Comparing fixed-length digests keeps the comparison from leaking the token's length.
    return hashlib.sha256(token.encode("utf-8")).digest()


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
        self._digests = tuple(_digest(token) for token in _checked_tokens(tokens))
        self._exempt = frozenset(exempt_methods)

    def authorized(self, metadata: Sequence[tuple[str, str | bytes]] | None) -> bool:
        values = [value for key, value in metadata or () if key.lower() == "authorization"]
        if len(values) != 1 or not isinstance(values[0], str):
            return False
        scheme, _, token = values[0].partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            return False
        presented = _digest(token.strip())
        matched = False
        for digest in self._digests:  # no early exit: the time taken does not say which one matched
            matched |= hmac.compare_digest(digest, presented)
        return matched

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


def read_tokens(path: Path) -> tuple[str, ...]:
    """One token per line; blank lines and `#` comments ignored."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return tuple(line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#"))


@dataclass(frozen=True, slots=True)
class EngineSecurity:
    """The engine's authentication settings. The default (no token, no TLS) is for loopback and
    unix sockets only; the CLI should refuse a non-loopback address without one or the other."""

    tokens: tuple[str, ...] = ()
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_client_ca: Path | None = None

    def __post_init__(self) -> None:
        if self.tokens:
            object.__setattr__(self, "tokens", _checked_tokens(self.tokens))
        if (self.tls_cert is None) != (self.tls_key is None):
            raise ValueError("--tls-cert and --tls-key go together")
        if self.tls_client_ca is not None and self.tls_cert is None:
            raise ValueError("--tls-client-ca needs --tls-cert and --tls-key")

    @property
    def uses_tls(self) -> bool:
        return self.tls_cert is not None

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

    @classmethod
    def from_args(cls, args: argparse.Namespace, environ: Mapping[str, str] | None = None) -> EngineSecurity:
        """From the flags of `add_security_arguments`; tokens from --auth-token-file, else the env."""
        env = os.environ if environ is None else environ
        if args.auth_token_file is not None:
            tokens = read_tokens(args.auth_token_file)
            if not tokens:
                raise ValueError(f"{args.auth_token_file}: no token in the file")
        else:
            tokens = tuple(token for token in env.get(TOKEN_ENV, "").split(",") if token.strip())
        return cls(
            tokens=tokens, tls_cert=args.tls_cert, tls_key=args.tls_key, tls_client_ca=args.tls_client_ca
        )


def add_security_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("authentication")
    group.add_argument(
        "--auth-token-file",
        type=Path,
        default=None,
        help=f"file with the shared token(s) callers must send as 'authorization: Bearer <token>', "
        f"one per line (default: ${TOKEN_ENV}, comma-separated; none: no token required)",
    )
    group.add_argument("--tls-cert", type=Path, default=None, help="PEM certificate chain: serve TLS")
    group.add_argument("--tls-key", type=Path, default=None, help="PEM private key for --tls-cert")
    group.add_argument(
        "--tls-client-ca",
        type=Path,
        default=None,
        help="PEM CA bundle: require client certificates (mutual TLS)",
    )
