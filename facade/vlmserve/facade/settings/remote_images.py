"""Remote image settings: whether http(s) image URLs are fetched, from which hosts, within which
bounds (`RemoteImageSettings`), and the host-name rules an allowed domain and a URL's host both
follow. `remote_images/checks.py` checks URLs against these; nothing here fetches.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, ClassVar

import httpx
from pydantic import Field, field_validator, model_validator

from vlmserve.server.settings import DeclaredSettings, Option

__all__ = ["RemoteImageSettings", "is_dns_name"]

_LABEL = re.compile(r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?")
# WHATWG parsers read a host whose last label is numeric as an IPv4 address (`2130706433`,
# `0x7f.1`, `127.1`); such hosts are refused unless they are a canonical dotted quad.
_NUMERIC_LABEL = re.compile(r"0x[0-9a-f]*|[0-9]+")


def is_dns_name(name: str) -> bool:
    """A lowercase ASCII DNS name of plain labels, its last label not numeric."""
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
    if not is_dns_name(raw):
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
