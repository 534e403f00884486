"""The decisions behind remote image fetching, without I/O: URL and host checks against the
settings (settings/remote_images.py), and which IP addresses may be reached. `remote_images` does
the fetching with these.

The URL is parsed once, by `httpx.URL`; a `Target` is everything the connection will use (scheme,
host, port, path), taken from that one parse, so the check and the fetch cannot disagree.
"""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass
from enum import StrEnum

import httpx

from vlmserve.facade.settings.remote_images import RemoteImageSettings, is_dns_name

__all__ = [
    "DEFAULT_PORTS",
    "IPAddress",
    "RefusalCause",
    "Refused",
    "Target",
    "check_url",
    "is_public_address",
    "join_url",
    "parse_url",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

DEFAULT_PORTS = {"http": 80, "https": 443}
_MAX_URL_CHARS = 4096


class RefusalCause(StrEnum):
    """Why a fetch was refused or failed: for logs and tests, never shown to the client."""

    DISABLED = "disabled"
    BAD_URL = "bad_url"
    SCHEME = "scheme_not_allowed"
    DOMAIN = "domain_not_allowed"
    DNS = "dns_failed"
    ADDRESS = "address_forbidden"
    CONNECT = "connect_failed"
    TLS = "tls_failed"
    HTTP_STATUS = "http_status"
    REDIRECTS = "too_many_redirects"
    TOO_LARGE = "image_too_large"
    REQUEST_BUDGET = "request_budget_exceeded"
    TIMEOUT = "timeout"
    PROTOCOL = "protocol_error"


class Refused(Exception):
    """Internal: a check failed. `detail` is for the log line only."""

    def __init__(self, cause: RefusalCause, detail: str = "") -> None:
        super().__init__(cause.value)
        self.cause = cause
        self.detail = detail


# --- URLs ----------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Target:
    """What one HTTP exchange uses, all taken from one `httpx.URL` parse."""

    scheme: str
    host: str  # lowercase ASCII DNS name, or canonical IP text
    literal: IPAddress | None  # set when the host is an IP literal
    port: int
    path: str  # path and query, percent-encoded ASCII

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if self.literal is not None and self.literal.version == 6 else self.host
        return host if self.port == DEFAULT_PORTS[self.scheme] else f"{host}:{self.port}"


def parse_url(url: str) -> httpx.URL:
    # `\` is a path separator to WHATWG parsers and userinfo to RFC 3986 ones: refuse it outright.
    if "\\" in url or len(url) > _MAX_URL_CHARS:
        raise Refused(RefusalCause.BAD_URL)
    try:
        parsed = httpx.URL(url)
    except Exception:  # httpx raises InvalidURL, idna errors and others for malformed input
        raise Refused(RefusalCause.BAD_URL) from None
    return parsed  # relative or host-less URLs fail check_url's scheme or host test


def join_url(base: httpx.URL, location: str) -> httpx.URL:
    """A redirect's `Location`, resolved against the URL that answered it."""
    if "\\" in location or len(location) > _MAX_URL_CHARS:
        raise Refused(RefusalCause.BAD_URL, "redirect")
    try:
        return base.join(location)
    except Exception:  # same families of errors as in parse_url
        raise Refused(RefusalCause.BAD_URL, "redirect") from None


def check_url(url: httpx.URL, settings: RemoteImageSettings) -> Target:
    """Scheme, userinfo, host form, port and allowlist; the Target if all pass."""
    if url.scheme not in DEFAULT_PORTS:
        raise Refused(RefusalCause.SCHEME, url.scheme)
    if url.scheme == "http" and not settings.allow_http:
        raise Refused(RefusalCause.SCHEME, "http")
    if url.userinfo:
        raise Refused(RefusalCause.BAD_URL, "userinfo")
    host, literal = _checked_host(url.raw_host)
    port = url.port if url.port is not None else DEFAULT_PORTS[url.scheme]
    if not 0 < port < 65536:
        raise Refused(RefusalCause.BAD_URL, "port")
    if not settings.allows_host(host, is_literal=literal is not None):
        raise Refused(RefusalCause.DOMAIN, host)
    return Target(url.scheme, host, literal, port, url.raw_path.decode("ascii") or "/")


def _checked_host(raw_host: bytes) -> tuple[str, IPAddress | None]:
    """A canonical IP literal, or a lowercase ASCII DNS name of plain labels; nothing else
    (no `%`, no `_`, no empty or numeric last label, no IPv6 zone)."""
    try:
        host = raw_host.decode("ascii").lower()
    except UnicodeDecodeError:
        raise Refused(RefusalCause.BAD_URL, "host") from None
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        if isinstance(literal, ipaddress.IPv6Address) and literal.scope_id:
            raise Refused(RefusalCause.BAD_URL, "scoped address")
        return str(literal), literal
    name = host.removesuffix(".")
    if not is_dns_name(name):
        raise Refused(RefusalCause.BAD_URL, "host")
    return name, None


# --- addresses -----------------------------------------------------------------------------------

_FORBIDDEN_NETWORKS = tuple(
    ipaddress.ip_network(network)
    for network in (
        "0.0.0.0/8", "10.0.0.0/8", "100.64.0.0/10", "127.0.0.0/8", "169.254.0.0/16", "172.16.0.0/12",
        "192.0.0.0/24", "192.0.2.0/24", "192.88.99.0/24", "192.168.0.0/16", "198.18.0.0/15",
        "198.51.100.0/24", "203.0.113.0/24", "224.0.0.0/4", "240.0.0.0/4",
        "::/8", "64:ff9b:1::/48", "100::/64", "2001::/23", "2001:db8::/32", "3fff::/20", "5f00::/16",
        "fc00::/7", "fe80::/10", "fec0::/10", "ff00::/8",
    )
)  # fmt: skip
_NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def is_public_address(address: IPAddress) -> bool:
    """Whether `address` is public unicast: the default address policy.

    IPv6 forms that carry an IPv4 address (IPv4-mapped, NAT64, 6to4) are judged by that address;
    Teredo and scoped addresses are refused. An explicit list of special-purpose ranges and
    Python's `is_global` must both agree (the latter alone varies across Python versions).
    """
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return is_public_address(address.ipv4_mapped)
        if address in _NAT64:
            return is_public_address(ipaddress.IPv4Address(int(address) & 0xFFFFFFFF))
        if address.sixtofour is not None:
            return is_public_address(address.sixtofour)
        if address.teredo is not None or address.scope_id:
            return False
    if any(address in network for network in _FORBIDDEN_NETWORKS):
        return False
    return address.is_global and not address.is_multicast
