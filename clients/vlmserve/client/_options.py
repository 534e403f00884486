"""Channel settings shared by the engine server and its clients."""

from __future__ import annotations

from dataclasses import dataclass

# A 20 MB image must pass, and a request may carry several: gRPC's 4 MB default is far too small.
MAX_MESSAGE_BYTES = 100 * 1024 * 1024

ENGINE_SERVICE_NAME = "vlmserve.engine.v1.EngineService"


def channel_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Client channel arguments: large messages, keepalive that tolerates long unary calls."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        # Ping an idle connection every 30 s so a dead engine is noticed, without
        # tripping the server's ping policy (it allows one per 10 s, see server_options).
        ("grpc.keepalive_time_ms", 30_000),
        ("grpc.keepalive_timeout_ms", 10_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        # Reconnect to a restarted engine quickly.
        ("grpc.initial_reconnect_backoff_ms", 200),
        ("grpc.max_reconnect_backoff_ms", 2_000),
    ]


def server_options(max_message_bytes: int = MAX_MESSAGE_BYTES) -> list[tuple[str, int]]:
    """Server arguments matching `channel_options`: a long non-streaming call is never cut."""
    return [
        ("grpc.max_send_message_length", max_message_bytes),
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", 60_000),
        ("grpc.keepalive_timeout_ms", 20_000),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.max_pings_without_data", 0),
        ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
        ("grpc.http2.min_time_between_pings_ms", 10_000),
        # gRPC sets SO_REUSEPORT by default, so a second engine on a taken port starts silently
        # and the kernel splits new connections between the two: refuse to bind instead.
        ("grpc.so_reuseport", 0),
    ]


def auth_metadata(token: str | None) -> tuple[tuple[str, str], ...]:
    """Call metadata carrying the engine token (see the engine's --auth-token-file)."""
    return (("authorization", f"Bearer {token}"),) if token else ()


@dataclass(frozen=True, slots=True)
class Deadlines:
    """Seconds allowed per call; every call has one."""

    generate: float = 600.0
    count_tokens: float = 60.0
    model_info: float = 10.0
    abort: float = 10.0
    health: float = 5.0


DEFAULT_DEADLINES = Deadlines()
