"""The `compaction` item's `encrypted_content`: sealed with a key only the facade has.

A compaction item carries what the model will read as its own earlier turn (the summary) and
the screenshots kept as images, so a client must neither read it nor write one: the state is
encrypted and authenticated with AES-256-GCM (the `cryptography` package), its associated data
binding it to the API key's owner. A changed byte, another owner's item, another server's (or
OpenAI's) item all fail to open: the request is a 400 naming the item's `encrypted_content`.

The key is 32 random bytes in a file (`--compaction-key-file`; by default `compaction.key`
beside the SQLite store), made on first use with owner-only permissions. Facades that share a
PostgreSQL store and serve the same clients must be given the same file.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import os
import secrets
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from vlmserve.responses import CompactionState

PREFIX = "vlmserve.compaction.v2."
_NONCE_BYTES = 12
_KEY_BYTES = 32
_CONTEXT = b"vlmserve compaction v2\x00"


def read_or_create_key(path: Path) -> bytes:
    """The key in `path`, made (atomically, mode 0600) when the file does not exist yet."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        descriptor, temporary = tempfile.mkstemp(prefix=".compaction-key-", dir=path.parent)
        try:
            with os.fdopen(descriptor, "wb") as stream:
                stream.write(secrets.token_bytes(_KEY_BYTES))
                stream.flush()
                os.fsync(stream.fileno())
            # link: a facade that raced us made the file first; its key is the one.
            with contextlib.suppress(FileExistsError):
                os.link(temporary, path)
        finally:
            os.unlink(temporary)
    key = path.read_bytes()
    if len(key) != _KEY_BYTES:
        raise ValueError(f"{path}: a compaction key is {_KEY_BYTES} bytes, this file has {len(key)}")
    return key


@dataclass(frozen=True)
class CompactionSeal:
    key: bytes = field(repr=False)

    def seal(self, state: CompactionState, *, owner: str) -> str:
        payload = json.dumps(state.to_json(), ensure_ascii=False, separators=(",", ":")).encode()
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = AESGCM(self.key).encrypt(nonce, payload, _CONTEXT + owner.encode())
        return PREFIX + base64.urlsafe_b64encode(nonce + sealed).decode("ascii")

    def open(self, content: str, *, owner: str) -> CompactionState | None:
        """The state an item of this server, sealed for `owner`, carries; None for anything else."""
        if not content.startswith(PREFIX):
            return None
        try:
            raw = base64.urlsafe_b64decode(content[len(PREFIX) :].encode("ascii"))
            if len(raw) <= _NONCE_BYTES:
                return None
            nonce, sealed = raw[:_NONCE_BYTES], raw[_NONCE_BYTES:]
            payload = AESGCM(self.key).decrypt(nonce, sealed, _CONTEXT + owner.encode())
            data: Any = json.loads(payload)
        except (binascii.Error, UnicodeEncodeError, ValueError, InvalidTag):
            return None
        return CompactionState.from_json(data)
