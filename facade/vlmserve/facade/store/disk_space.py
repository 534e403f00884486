"""Running out of disk (docs/hardening.md, "Round 3"): a clear answer, nothing half-written, and
readiness that says so.

On a full disk uploads and stored responses were a 500 (one connection reset), a stored stream
was cut before any event, and `/readyz` said 200 throughout. Now:

* `DiskSpace.low()` names a filesystem (the store's, the files') with less than `min_free_bytes`
  free; `/readyz` is then 503 `insufficient_storage`, and requests that would write (uploads,
  stored responses and conversations) are refused up front (`DiskSpace.check` raises
  `OutOfSpaceError`), before the engine is called or anything is written;
* a write that still finds the disk full (`is_out_of_space`: ENOSPC, EDQUOT, SQLite's "database
  or disk is full", PostgreSQL's disk-full) is the same error: the store raises it as
  `OutOfSpaceError`, its cause kept (`database.Database.run`, `files.FileRepository.save`); the
  file store removes what it had begun, and the store's transactions roll back.

The store knows no HTTP: the app answers both with 507 `insufficient_storage`
(`http/errors.py` `insufficient_storage`, wired in `app.py`).
"""

from __future__ import annotations

import errno
import logging
import shutil
import sqlite3
import time
from collections.abc import Sequence
from pathlib import Path

__all__ = ["DiskSpace", "OutOfSpaceError", "is_out_of_space"]

logger = logging.getLogger("vlmserve.facade")

_FULL_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT})
# psycopg's DiskFull (SQLSTATE 53100), without importing psycopg here.
_DISK_FULL_SQLSTATE = "53100"
# Free space is read at most this often (a statvfs per request would be cheap, but not free).
_CHECK_S = 1.0


class OutOfSpaceError(Exception):
    """What would be written was refused for lack of space: `what` was not stored."""

    def __init__(self, what: str = "this request") -> None:
        super().__init__(f"out of storage space: {what} was not stored")
        self.what = what


def is_out_of_space(error: BaseException) -> bool:
    """Whether `error` (or what caused it) is a write refused for lack of space."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, OutOfSpaceError):
            return True
        if isinstance(seen, OSError) and seen.errno in _FULL_ERRNOS:
            return True
        if isinstance(seen, sqlite3.OperationalError) and "full" in str(seen).lower():
            return True  # SQLITE_FULL: "database or disk is full"
        if getattr(seen, "sqlstate", None) == _DISK_FULL_SQLSTATE:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


class DiskSpace:
    """Free space on the filesystems the facade writes to."""

    def __init__(self, paths: Sequence[Path], *, min_free_bytes: int) -> None:
        self.paths = list(paths)
        self.min_free_bytes = min_free_bytes
        self._checked_at = -_CHECK_S
        self._low: str | None = None

    def low(self) -> str | None:
        """A sentence naming a filesystem short of space, or None when all have room."""
        now = time.monotonic()
        if now - self._checked_at < _CHECK_S:
            return self._low
        self._checked_at = now
        self._low = None
        for path in self.paths:
            existing = _existing(path)
            try:
                free = shutil.disk_usage(existing).free
            except OSError:
                continue
            if free < self.min_free_bytes:
                # No path in it: clients read /readyz too.
                self._low = f"{free} bytes free, under the {self.min_free_bytes} kept free"
                break
        return self._low

    def check(self, what: str = "this request") -> None:
        """OutOfSpaceError when a filesystem is short of space."""
        if self.low() is not None:
            raise OutOfSpaceError(what)


def _existing(path: Path) -> Path:
    # The store's file or the files' folder may not exist yet: their nearest existing parent.
    for candidate in (path, *path.parents):
        if candidate.exists():
            return candidate
    return Path(".")
