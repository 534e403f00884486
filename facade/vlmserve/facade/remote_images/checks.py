"""The decisions behind remote image fetching, without I/O: settings, URL and host checks, and
which IP addresses may be reached. `remote_images` does the fetching with these.

The URL is parsed once, by `httpx.URL`; a `Target` is everything the connection will use (scheme,
host, port, path), taken from that one parse, so the check and the fetch cannot disagree.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, ClassVar

import httpx
from pydantic import Field, field_validator, model_validator

from vlmserve.server.settings import DeclaredSettings, Option

__all__ = [
    "DEFAULT_PORTS",
    "IPAddress",
    "RefusalCause",
    "Refused",
    "RemoteImageSettings",
    "Target",
    "check_url",
    "is_public_address",
    "join_url",
    "parse_url",
]

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

DEFAULT_PORTS = {"http": 80, "https": 443}
_MAX_URL_CHARS = 4096
_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
# WHATWG parsers read a host whose last label is numeric as an IPv4 address (`2130706433`,
# `0x7f.1`, `127.1`); such hosts are refused unless they are a canonical dotted quad.
_NUMERIC_LABEL = re.compile(r"0x[0-9a-f]*|[0-9]+")


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


# --- settings ------------------------------------------------------------------------------------


def _is_dns_name(name: str) -> bool:
    labels = name.split(".")
    return (
        0 < len(name) <= 253
        and all(_LABEL.fullmatch(label) for label in labels)
        and not _NUMERIC_LABEL.fullmatch(labels[-1])
    )


def _normalise_name(name: str) -> str:
    """The lowercase ASCII (IDNA) form httpx gives a host name, as URLs will be compared."""
    if any(char in name for char in "/\\@:?#%[] \t"):
        raise ValueError(f"not a valid domain: {name!r}")
    try:
        raw = httpx.URL(f"https://{name}/").raw_host.decode("ascii").rstrip(".")
    except Exception as exc:  # httpx raises InvalidURL and idna errors
        raise ValueError(f"not a valid domain: {name!r}") from exc
    if not _is_dns_name(raw):
        raise ValueError(f"not a valid domain: {name!r}")
    return raw


def _normalise_entry(entry: str) -> str:
    entry = entry.strip().lower()
    if entry.startswith("*."):
        return "*." + _normalise_name(entry[2:])
    try:
        return str(ipaddress.ip_address(entry.strip("[]")))
    except ValueError:
        return _normalise_name(entry)


class RemoteImageSettings(DeclaredSettings):
    """Remote images: http(s) image URLs, fetched only from allowed hosts (off by default)"""

    ENV_PREFIX: ClassVar[str] = "VLMSERVE_FACADE_REMOTE_IMAGES_"
    FLAG_PREFIX: ClassVar[str] = "remote_images_"

    enabled: bool = Field(False, description="fetch remote image URLs (on when allowed domains are given)")
    # There is deliberately no "any host" entry.
    allowed_domains: Annotated[
        tuple[str, ...], Option(flag="--allow-remote-images-from", metavar="DOMAIN")
    ] = Field(
        (),
        description="hosts to fetch from: exact, or *.example.com for names strictly below it",
    )
    allow_http: bool = Field(False, description="allow http:// as well as https://")
    max_bytes_per_image: Annotated[int, Option(flag="--remote-image-max-bytes")] = Field(
        20 * 1024 * 1024, gt=0, description="bytes per fetched image"
    )
    max_bytes_per_request: Annotated[int, Option(flag="--remote-images-max-request-bytes")] = Field(
        50 * 1024 * 1024, gt=0, description="fetched bytes per request"
    )
    timeout_s: Annotated[float, Option(flag="--remote-image-timeout")] = Field(
        10.0, gt=0, description="seconds per image: DNS, connect, TLS, every redirect, headers and body"
    )
    # So many slow URLs cannot hold a worker for long.
    request_timeout_s: Annotated[float, Option(flag="--remote-images-request-timeout")] = Field(
        30.0, gt=0, description="seconds for all of one request's fetches together"
    )
    max_redirects: int = Field(3, ge=0, le=10, description="redirects followed per image")

    @model_validator(mode="before")
    @classmethod
    def _enabled_by_domains(cls, data: Any) -> Any:
        if isinstance(data, dict) and data.get("enabled") is None and data.get("allowed_domains"):
            data = {**data, "enabled": True}
        return data

    @field_validator("allowed_domains")
    @classmethod
    def _normalise_domains(cls, domains: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(_normalise_entry(entry) for entry in domains if entry.strip())

    def allows_host(self, host: str, *, is_literal: bool) -> bool:
        """`host` is a `Target.host`. IP literals match only an identical entry."""
        for entry in self.allowed_domains:
            if entry == host or (not is_literal and entry.startswith("*.") and host.endswith(entry[1:])):
                return True
        return False


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
    if not _is_dns_name(name):
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
