"""Engine addresses: one engine, or several serving the same model behind one gRPC channel.

Several engines are gRPC's own business: the channel resolves the target (`dns:///name:port`,
`ipv4:a:p,b:p`), balances calls over every healthy address with the `round_robin` policy, and
watches each engine's `grpc.health.v1` status (client-side health checking: an engine that is
loading or draining gets no new calls). A call that fails UNAVAILABLE before the engine sent
anything back (it died, or was not ready) is retried once by gRPC's retry policy, on another
engine when there is one; once the first token arrived the call is committed and a failure
reaches the caller as before.
"""

from __future__ import annotations

import ipaddress
import json
import socket
from typing import Any

from ._options import ENGINE_SERVICE_NAME

__all__ = ["balancing_options", "engine_target", "names_several_engines"]

_SCHEMES = ("dns:", "ipv4:", "ipv6:")


def engine_target(address: str) -> str:
    """The gRPC target for an engine address setting.

    A gRPC target name is used as is ("host:port", "unix:/path", "dns:///name:port",
    "ipv4:10.0.0.1:50051,10.0.0.2:50051"). A comma-separated list of host:port becomes an
    `ipv4:`/`ipv6:` target; host names in it are resolved once, now (for a set of engines that
    changes, use one DNS name with several addresses: `dns:///engines.example:50051`).
    """
    address = address.strip()
    if "," not in address or address.startswith(_SCHEMES):
        return address
    entries = [entry.strip() for entry in address.split(",") if entry.strip()]
    resolved = [_resolve(entry) for entry in entries]
    families = {family for family, _ in resolved}
    if len(families) != 1:
        raise ValueError(f"engine addresses {address!r} mix IPv4 and IPv6; gRPC takes one family per list")
    scheme = "ipv4" if families == {4} else "ipv6"
    return f"{scheme}:" + ",".join(endpoint for _, endpoint in resolved)


def _resolve(entry: str) -> tuple[int, str]:
    host, sep, port = entry.rpartition(":")
    if not sep or not port.isdigit() or not host:
        raise ValueError(f"engine address {entry!r} in a list must be host:port")
    host = host.strip("[]")
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        try:
            infos = socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
        except OSError as error:
            raise ValueError(f"engine address {entry!r}: cannot resolve {host!r}: {error}") from None
        ip = ipaddress.ip_address(sorted(infos, key=lambda info: info[0] != socket.AF_INET)[0][4][0])
    if ip.version == 4:
        return 4, f"{ip}:{port}"
    return 6, f"[{ip}]:{port}"


def names_several_engines(target: str) -> bool:
    """Whether the target may resolve to several engines (then calls are balanced over them)."""
    return target.startswith(_SCHEMES)


def service_config() -> dict[str, Any]:
    return {
        "loadBalancingConfig": [{"round_robin": {}}],
        "healthCheckConfig": {"serviceName": ENGINE_SERVICE_NAME},
        "methodConfig": [
            {
                "name": [{"service": ENGINE_SERVICE_NAME}],
                "retryPolicy": {
                    # One retry: the first attempt plus one more, never more.
                    "maxAttempts": 2,
                    "initialBackoff": "0.05s",
                    "maxBackoff": "0.5s",
                    "backoffMultiplier": 2,
                    "retryableStatusCodes": ["UNAVAILABLE"],
                },
            }
        ],
    }


def balancing_options(max_message_bytes: int) -> list[tuple[str, Any]]:
    """Channel arguments for several engines: round_robin, health checking, one retry."""
    return [
        ("grpc.service_config", json.dumps(service_config())),
        ("grpc.enable_retries", 1),
        # A retry replays the request from this buffer; gRPC's default (256 KiB) would make any
        # request with an image too big to retry.
        ("grpc.per_rpc_retry_buffer_size", max_message_bytes),
        ("grpc.retry_buffer_size", 4 * max_message_bytes),
    ]
