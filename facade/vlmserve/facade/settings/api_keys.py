"""The facade's configured API keys, as the settings hold them: `ApiKeys` (SHA-256 digests, and
who a presented key's owner is) and the variables that name them. `http/api_keys.py` checks a
request's key against these; nothing here knows HTTP.

Keys come from `VLMSERVE_API_KEYS` (comma-separated) and/or the file named by
`VLMSERVE_API_KEYS_FILE` (one per line, `#` comments); operator keys (for `/metrics`) from
`VLMSERVE_OPERATOR_KEYS`. An owner id is a truncated SHA-256 of the key, so stored responses can
belong to the key that made them without the key itself being stored.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from vlmserve.server.secrets import digest, matches_any, read_secret_file

__all__ = ["API_KEYS_ENV", "API_KEYS_FILE_ENV", "OPERATOR_KEYS_ENV", "ApiKeys", "probe_key"]

API_KEYS_ENV = "VLMSERVE_API_KEYS"
API_KEYS_FILE_ENV = "VLMSERVE_API_KEYS_FILE"
OPERATOR_KEYS_ENV = "VLMSERVE_OPERATOR_KEYS"
_OWNER_HEX_CHARS = 24  # 96 bits: unique per key, and not the key's full digest


def _owner_from_digest(digest: bytes) -> str:
    return "key_" + digest.hex()[:_OWNER_HEX_CHARS]


@dataclass(frozen=True, slots=True)
class ApiKeys:
    """The configured keys, as SHA-256 digests. Empty: authentication off."""

    digests: tuple[bytes, ...] = ()

    @classmethod
    def from_keys(cls, keys: Iterable[str]) -> ApiKeys:
        unique = dict.fromkeys(key.strip() for key in keys if key.strip())
        return cls(tuple(digest(key) for key in unique))

    @property
    def enabled(self) -> bool:
        return bool(self.digests)

    def owner_for_key(self, key: str) -> str | None:
        """The owner id if `key` is one of ours, else None. Compares with every key."""
        presented = digest(key)
        return _owner_from_digest(presented) if matches_any(self.digests, presented) else None


def probe_key(environ: Mapping[str, str] | None = None, *, key_file: Path | None = None) -> str | None:
    """One configured key (the first), for a local probe of `/readyz` such as the launcher's."""
    env = os.environ if environ is None else environ
    keys = [key.strip() for key in env.get(API_KEYS_ENV, "").split(",") if key.strip()]
    file = key_file or (Path(env[API_KEYS_FILE_ENV]) if env.get(API_KEYS_FILE_ENV) else None)
    if not keys and file is not None:
        keys = read_secret_file(file)
    return keys[0] if keys else None
