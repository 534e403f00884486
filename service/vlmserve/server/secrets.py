"""Shared secrets (the facade's API keys, the engine's tokens): held as digests, compared in
constant time, read from files. One copy, used by the engine's grpc_auth and the facade's api_keys.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Iterable
from pathlib import Path

__all__ = ["digest", "matches_any", "read_secret_file"]


def digest(secret: str) -> bytes:
    """SHA-256 of the secret. Comparing fixed-length digests keeps a comparison from leaking the
    secret's length, and lets a server hold no secret in memory."""
    return hashlib.sha256(secret.encode("utf-8")).digest()


def matches_any(digests: Iterable[bytes], presented: bytes) -> bool:
    """Whether `presented` (a digest) equals one of `digests`. Compares with every one, with no
    early exit, so the time taken says nothing about which matched or how close a guess was."""
    matched = False
    for candidate in digests:
        matched |= hmac.compare_digest(candidate, presented)
    return matched


def read_secret_file(path: Path) -> list[str]:
    """One secret per line; blank lines and `#` comments ignored."""
    lines = Path(path).read_text(encoding="utf-8").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
