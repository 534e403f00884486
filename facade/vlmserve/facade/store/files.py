"""Uploaded files on disk, one folder per API key (docs/responses-api.md, Files).

Files are kept out of the response store on purpose (whatever backs it, SQLite or another
database): a directory beside it, `<root>/<owner>/<file id>` for the bytes and
`<file id>.json` beside them for what the API shows (name, purpose, size, time) and the media
type sniffed at upload. Both are written to a temporary name and renamed into place, the bytes
first: a file exists once its metadata does, so a reader never sees half a file, and a crash
leaves at most an orphan temporary (removed at start-up).

Quotas (`FileQuota`: bytes on disk and files per owner) are checked and the file written under
the owner's lock (`flock` on `<root>/<owner>/.lock`, so facades sharing the directory take turns):
two uploads can never both pass the last of a quota. What counts is what the owner's files take
on disk (allocated blocks, their records included: 2,000 one-byte files took 16.8 MB), and how
many there are.

Ids are checked against their exact form before any path is built from them, and owners are
reduced to a safe folder name, so no request can name a path outside its owner's folder.
`FileRepository`'s methods are coroutines that do their disk work in a worker thread, once,
inside; only the translation's `RequestFiles`, already on a worker thread, reads blocking.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import json
import logging
import os
import re
import secrets
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

from vlmserve.facade.store.disk_space import OutOfSpaceError, is_out_of_space
from vlmserve.responses import FileContent

__all__ = [
    "FileQuota",
    "FileQuotaExceededError",
    "FileRecord",
    "FileRepository",
    "RequestFiles",
    "new_file_id",
]

logger = logging.getLogger("vlmserve.facade.files")

_FILE_ID = re.compile(r"file-[0-9a-f]{48}")
_SAFE_OWNER = re.compile(r"[A-Za-z0-9_-]{1,64}")
_TEMP_PREFIX = ".upload-"
_META_SUFFIX = ".json"
_LOCK_NAME = ".lock"


def new_file_id() -> str:
    """`file-` and 192 random bits, as OpenAI spells file ids (with a dash)."""
    return f"file-{secrets.token_hex(24)}"


@dataclass(frozen=True)
class FileRecord:
    id: str
    bytes: int
    created_at: int
    filename: str
    purpose: str
    # Sniffed from the bytes at upload (never the client's content type).
    media_type: str


@dataclass(frozen=True)
class FileQuota:
    """What one owner's files may take: bytes on disk, and how many (None: no bound)."""

    max_disk_bytes: int | None = None
    max_files: int | None = None


class FileQuotaExceededError(Exception):
    """The owner's files would pass their quota; the message says which part and by how much."""


# One page of an owner's files and whether more follow (named here: inside the repository
# `list` is its method).
FilePage = tuple[list[FileRecord], bool]


class FileRepository:
    def __init__(self, root: Path) -> None:
        self.root = root

    async def save(
        self,
        owner: str,
        data: bytes,
        *,
        filename: str,
        purpose: str,
        media_type: str,
        quota: FileQuota | None = None,
    ) -> FileRecord:
        """Write a file; under the owner's lock, after checking `quota` (FileQuotaExceededError).
        On any failure nothing of it is left; a full disk is OutOfSpaceError (its cause kept)."""
        try:
            return await asyncio.to_thread(
                _save,
                self._folder(owner),
                data,
                filename=filename,
                purpose=purpose,
                media_type=media_type,
                quota=quota,
            )
        except OSError as error:
            if is_out_of_space(error):
                raise OutOfSpaceError("the file") from error
            raise

    async def get(self, owner: str, file_id: str) -> FileRecord | None:
        return await asyncio.to_thread(self._get, owner, file_id)

    async def read(self, owner: str, file_id: str) -> tuple[FileRecord, bytes] | None:
        """A file's record and bytes, or None (unknown id, another owner's, or deleted)."""
        return await asyncio.to_thread(self.read_blocking, owner, file_id)

    async def delete(self, owner: str, file_id: str) -> bool:
        return await asyncio.to_thread(self._delete, owner, file_id)

    async def list(
        self,
        owner: str,
        *,
        purpose: str | None = None,
        after: str | None = None,
        limit: int = 10000,
        order: Literal["asc", "desc"] = "desc",
    ) -> FilePage:
        """One page of the owner's files by creation time (ties by id), and whether more follow."""
        return await asyncio.to_thread(self._list, owner, purpose, after, limit, order)

    async def usage(self, owner: str) -> tuple[int, int]:
        """The owner's files: how many, and the bytes they (and their records) take on disk."""
        return await asyncio.to_thread(self._usage, owner)

    async def remove_orphans(self) -> None:
        """Temporaries an interrupted upload left behind (start-up)."""
        await asyncio.to_thread(self._remove_orphans)

    def read_blocking(self, owner: str, file_id: str) -> tuple[FileRecord, bytes] | None:
        """`read`, for code already on a worker thread (the translation's file source)."""
        paths = self._paths(owner, file_id)
        if paths is None:
            return None
        record = _read_record(paths[1])
        if record is None:
            return None
        try:
            return record, paths[0].read_bytes()
        except FileNotFoundError:  # deleted between the two reads
            return None

    # ---- in a worker thread ----------------------------------------------------------------

    def _folder(self, owner: str) -> Path:
        if _SAFE_OWNER.fullmatch(owner):
            return self.root / owner
        return self.root / ("h_" + hashlib.sha256(owner.encode()).hexdigest()[:32])

    def _paths(self, owner: str, file_id: str) -> tuple[Path, Path] | None:
        if not _FILE_ID.fullmatch(file_id):
            return None
        folder = self._folder(owner)
        return folder / file_id, folder / (file_id + _META_SUFFIX)

    def _get(self, owner: str, file_id: str) -> FileRecord | None:
        paths = self._paths(owner, file_id)
        if paths is None:
            return None
        return _read_record(paths[1])

    def _delete(self, owner: str, file_id: str) -> bool:
        paths = self._paths(owner, file_id)
        if paths is None:
            return False
        content, meta = paths
        try:
            meta.unlink()  # first: from now on the file does not exist for readers
        except FileNotFoundError:
            return False
        content.unlink(missing_ok=True)
        return True

    def _list(
        self, owner: str, purpose: str | None, after: str | None, limit: int, order: Literal["asc", "desc"]
    ) -> FilePage:
        folder = self._folder(owner)
        found = (
            (_read_record(path) for path in folder.glob("file-*" + _META_SUFFIX)) if folder.is_dir() else ()
        )
        records = [r for r in found if r is not None and (purpose is None or r.purpose == purpose)]
        records.sort(key=lambda r: (r.created_at, r.id), reverse=order == "desc")
        if after is not None:
            ids = [r.id for r in records]
            records = records[ids.index(after) + 1 :] if after in ids else []
        return records[:limit], len(records) > limit

    def _usage(self, owner: str) -> tuple[int, int]:
        folder = self._folder(owner)
        return _usage(folder) if folder.is_dir() else (0, 0)

    def _remove_orphans(self) -> None:
        if not self.root.is_dir():
            return
        for path in self.root.glob(f"*/{_TEMP_PREFIX}*"):
            with contextlib.suppress(OSError):
                path.unlink()


def _save(
    folder: Path,
    data: bytes,
    *,
    filename: str,
    purpose: str,
    media_type: str,
    quota: FileQuota | None,
) -> FileRecord:
    """`FileRepository.save` in `folder`, under the owner's lock."""
    record = FileRecord(
        id=new_file_id(),
        bytes=len(data),
        created_at=int(time.time()),
        filename=filename,
        purpose=purpose,
        media_type=media_type,
    )
    metadata = json.dumps(asdict(record), ensure_ascii=False).encode()
    content, meta = folder / record.id, folder / (record.id + _META_SUFFIX)
    folder.mkdir(parents=True, exist_ok=True)
    with _locked(folder / _LOCK_NAME):
        if quota is not None:
            adding = _on_disk(folder, len(data)) + _on_disk(folder, len(metadata))
            _check_quota(folder, quota, adding=adding)
        _write_atomic(content, data)
        try:
            _write_atomic(meta, metadata)
        except BaseException:
            content.unlink(missing_ok=True)
            raise
    return record


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    with open(path, "a+b") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def _usage(folder: Path) -> tuple[int, int]:
    """Files (by their records) and allocated bytes of everything of theirs in `folder`; a
    stat per entry, no file read (a quota check must not cost a read of every record)."""
    files = disk = 0
    with os.scandir(folder) as entries:
        for entry in entries:
            if not entry.name.startswith("file-"):
                continue
            with contextlib.suppress(FileNotFoundError):  # deleted meanwhile
                disk += entry.stat(follow_symlinks=False).st_blocks * 512
                if entry.name.endswith(_META_SUFFIX):
                    files += 1
    return files, disk


def _on_disk(folder: Path, size: int) -> int:
    """What `size` bytes will take on disk: whole blocks (at least one, for an empty file's
    record of it in the tally)."""
    block = os.statvfs(folder).f_frsize or 4096
    return max(1, -(-size // block)) * block


def _check_quota(folder: Path, quota: FileQuota, *, adding: int) -> None:
    files, disk = _usage(folder)
    if quota.max_files is not None and files + 1 > quota.max_files:
        raise FileQuotaExceededError(
            f"this API key has {files} files, its limit is {quota.max_files}. Delete files first."
        )
    if quota.max_disk_bytes is not None and disk + adding > quota.max_disk_bytes:
        raise FileQuotaExceededError(
            f"this API key's files take {disk} bytes on disk of its {quota.max_disk_bytes}, and this "
            f"upload would add {adding}. Delete files first."
        )


def _read_record(path: Path) -> FileRecord | None:
    try:
        return FileRecord(**json.loads(path.read_bytes()))
    except FileNotFoundError:
        return None
    except (ValueError, TypeError):
        # Not a record this code wrote (edited or damaged by hand): as if it were not there.
        logger.warning("unreadable file record %s ignored", path.name)
        return None


def _write_atomic(path: Path, data: bytes) -> None:
    descriptor, temporary = tempfile.mkstemp(dir=path.parent, prefix=_TEMP_PREFIX)
    try:
        with os.fdopen(descriptor, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


class RequestFiles:
    """The translation's `FileSource` for one request: the owner's files (what every use reads is
    charged to the request's budget by the translation, `DocumentLimits.max_file_bytes_per_request`)."""

    def __init__(self, store: FileRepository, owner: str) -> None:
        self._store = store
        self._owner = owner

    def __call__(self, file_id: str) -> FileContent | None:
        found = self._store.read_blocking(self._owner, file_id)
        if found is None:
            return None
        record, data = found
        return FileContent(data=data, filename=record.filename)
