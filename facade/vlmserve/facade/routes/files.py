"""`/v1/files`: upload, list, retrieve, delete and download files, per API key (OpenAI's shapes).

Uploads are `multipart/form-data` with `file` and `purpose` (`user_data` or `vision`). The body
is bounded before it is read (its Content-Length: `--max-file-bytes` plus room for the form),
held in the facade's body budget as it arrives and while it is handled, and must arrive within
the body timeout, at the minimum body rate (request_body.metered_body).
The file's kind is sniffed from its bytes (`vlmserve.common.documents`, `vlmserve.common.clips`),
never taken from the client's content type or name: PDFs, images (PNG, JPEG, WebP, GIF), UTF-8
text, videos (MP4, MOV, WebM, MKV, AVI) and audio (WAV, MP3, FLAC, Ogg Vorbis) are kept; `vision` takes
images only; anything else is a 400 naming `file`. Requests then name a file by its id
(`input_file.file_id`, `input_image.file_id`, `input_video.file_id`, `input_audio.file_id`;
`_files.py` and `_clips.py` in the translation).

Anthropic's Files API is the same routes: a request with an `anthropic-beta: files-api-…` header
or `anthropic-version` (the anthropic SDK's `beta.files`) uploads without `purpose` (kept as
`user_data`) and gets Anthropic's shapes back: `{"id", "type": "file", "filename", "mime_type", "size_bytes",
"created_at" (RFC 3339), "downloadable"}`, lists of them, and `{"id", "type": "file_deleted"}`.
Its files are the same files: a Messages `document` or `image` block names one by `file_id`.
"""

from __future__ import annotations

import asyncio
import datetime
import urllib.parse
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query, Request, Response
from fastapi.responses import JSONResponse
from pydantic import BaseModel
from starlette.datastructures import UploadFile

from vlmserve.common.clips import sniff_clip
from vlmserve.common.documents import DocumentError, sniff_file
from vlmserve.facade.http.api_keys import owner_of
from vlmserve.facade.http.errors import APIError, not_found
from vlmserve.facade.http.request_body import metered_body
from vlmserve.facade.state import FacadeState, facade_state
from vlmserve.facade.store.files import FileQuota, FileQuotaExceededError, FileRecord, FileRepository
from vlmserve.responses import InvalidRequestError

__all__ = ["PURPOSES", "router"]

router = APIRouter(prefix="/v1/files", tags=["files"])
State = Annotated[FacadeState, Depends(facade_state)]

PURPOSES = ("user_data", "vision")
# Room for the multipart framing and the `purpose` field around the file itself.
_FORM_OVERHEAD_BYTES = 64 * 1024
_MAX_FILENAME_CHARS = 255
_CHUNK = 1024 * 1024


class FileObject(BaseModel):
    """OpenAI's `File` object."""

    id: str
    object: Literal["file"]
    bytes: int
    created_at: int
    filename: str
    purpose: Literal["user_data", "vision"]
    status: Literal["uploaded", "processed", "error"]
    expires_at: int | None = None
    status_details: str | None = None


class FileList(BaseModel):
    object: Literal["list"]
    data: list[FileObject]
    first_id: str | None
    last_id: str | None
    has_more: bool


class FileDeleted(BaseModel):
    id: str
    object: Literal["file"]
    deleted: bool


def anthropic_files(request: Request) -> bool:
    """Whether the client speaks Anthropic's Files API: its beta header names `files-api-…`, or
    it is an Anthropic client (the anthropic SDK sends `anthropic-version` on every request, and
    `beta.files.upload` sends the beta header only when asked to)."""
    betas = ",".join(request.headers.getlist("anthropic-beta"))
    named = any(beta.strip().startswith("files-api-") for beta in betas.split(","))
    return named or "anthropic-version" in request.headers


def openai_file(record: FileRecord) -> dict[str, Any]:
    """OpenAI's `FileObject` for a stored file."""
    return {
        "id": record.id,
        "object": "file",
        "bytes": record.bytes,
        "created_at": record.created_at,
        "filename": record.filename,
        "purpose": record.purpose,
        "status": "processed",
        "expires_at": None,
        "status_details": None,
    }


def anthropic_file(record: FileRecord) -> dict[str, Any]:
    """Anthropic's `FileMetadata` for a stored file (every upload here can be downloaded)."""
    created = datetime.datetime.fromtimestamp(record.created_at, datetime.UTC)
    return {
        "id": record.id,
        "type": "file",
        "filename": record.filename,
        "mime_type": record.media_type,
        "size_bytes": record.bytes,
        "created_at": created.isoformat().replace("+00:00", "Z"),
        "downloadable": True,
    }


def _files(state: FacadeState) -> FileRepository:
    store = state.files
    if store is None:  # pragma: no cover - create_app always sets one
        raise APIError(404, "Files are not enabled on this server.", code="not_found")
    return store


@router.post(
    "",
    operation_id="createFile",
    response_model=FileObject,
    openapi_extra={
        "requestBody": {
            "required": True,
            "content": {
                "multipart/form-data": {
                    "schema": {
                        "type": "object",
                        "required": ["file", "purpose"],
                        "properties": {
                            "file": {"type": "string", "format": "binary"},
                            "purpose": {"type": "string", "enum": list(PURPOSES)},
                        },
                    }
                }
            },
        }
    },
)
async def create_file(request: Request, state: State) -> dict[str, Any] | Response:
    files = _files(state)
    settings = state.settings
    max_bytes = settings.files.max_file_bytes
    declared = request.headers.get("content-length")
    if declared is None or not declared.isdigit():
        raise APIError(411, "Uploads need a Content-Length header.", code="length_required")
    if int(declared) > max_bytes + _FORM_OVERHEAD_BYTES:
        raise _too_large(max_bytes)
    if state.disk is not None:
        state.disk.check("the file")
    with state.body_budget.hold() as hold:
        async with metered_body(
            request,
            limits=settings.limits,
            hold=hold,
            max_bytes=max_bytes + _FORM_OVERHEAD_BYTES,
            too_large_error=lambda _: _too_large(max_bytes),
        ) as body:
            form = await body.form(max_files=1, max_fields=16)
        try:
            given = form.get("purpose")
            purpose = "user_data" if given is None and anthropic_files(request) else _purpose(given)
            if form.get("expires_in_seconds") is not None:
                # Files here last until deleted: a promised expiry would not be kept.
                raise APIError(
                    400,
                    "'expires_in_seconds' is not supported: files are kept until deleted.",
                    param="expires_in_seconds",
                    code="unsupported",
                )
            upload = form.get("file")
            if not isinstance(upload, UploadFile):
                raise APIError(
                    400,
                    "Missing required parameter: 'file' (a multipart file field).",
                    param="file",
                    code="missing_required_parameter",
                )
            filename = _filename(upload.filename)
            data = await _read_upload(upload, max_bytes)
        finally:
            await form.close()
        media_type = await asyncio.to_thread(_check_kind, data, purpose)
        quota = FileQuota(settings.files.max_file_bytes_per_key, settings.files.max_files_per_key)
        try:
            record = await files.save(
                owner_of(request),
                data,
                filename=filename,
                purpose=purpose,
                media_type=media_type,
                quota=quota,
            )
        except FileQuotaExceededError as error:
            raise APIError(429, f"Storage quota exceeded: {error}", code="storage_quota_exceeded") from None
    return JSONResponse(anthropic_file(record)) if anthropic_files(request) else openai_file(record)


@router.get("", operation_id="listFiles", response_model=FileList)
async def list_files(
    request: Request,
    state: State,
    purpose: str | None = None,
    limit: Annotated[int, Query(ge=1, le=10000)] = 10000,
    order: Literal["asc", "desc"] = "desc",
    after: str | None = None,
    after_id: str | None = None,
    before_id: str | None = None,
) -> dict[str, Any] | Response:
    if before_id is not None:
        raise APIError(
            400,
            "'before_id' is not supported here; page with 'after_id'.",
            param="before_id",
            code="unsupported",
        )
    records, has_more = await _files(state).list(
        owner_of(request), purpose=purpose, after=after or after_id, limit=limit, order=order
    )
    if anthropic_files(request):
        return JSONResponse(
            {
                "data": [anthropic_file(record) for record in records],
                "first_id": records[0].id if records else None,
                "last_id": records[-1].id if records else None,
                "has_more": has_more,
            }
        )
    return {
        "object": "list",
        "data": [openai_file(record) for record in records],
        "first_id": records[0].id if records else None,
        "last_id": records[-1].id if records else None,
        "has_more": has_more,
    }


@router.get("/{file_id}", operation_id="retrieveFile", response_model=FileObject)
async def retrieve_file(file_id: str, request: Request, state: State) -> dict[str, Any] | Response:
    record = await _record(file_id, request, state)
    return JSONResponse(anthropic_file(record)) if anthropic_files(request) else openai_file(record)


@router.delete("/{file_id}", operation_id="deleteFile", response_model=FileDeleted)
async def delete_file(file_id: str, request: Request, state: State) -> dict[str, Any] | Response:
    deleted = await _files(state).delete(owner_of(request), file_id)
    if not deleted:
        raise not_found("file", file_id, param="file_id")
    if anthropic_files(request):
        return JSONResponse({"id": file_id, "type": "file_deleted"})
    return {"id": file_id, "object": "file", "deleted": True}


@router.get("/{file_id}/content", operation_id="downloadFile")
async def file_content(file_id: str, request: Request, state: State) -> Response:
    found = await _files(state).read(owner_of(request), file_id)
    if found is None:
        raise not_found("file", file_id, param="file_id")
    record, data = found
    return Response(
        data,
        media_type="text/plain; charset=utf-8" if record.media_type == "text/plain" else record.media_type,
        headers={
            # The type is ours (sniffed at upload); browsers must not second-guess it, and never
            # render an upload inline as a page of this origin.
            "X-Content-Type-Options": "nosniff",
            "Content-Disposition": "attachment; filename*=UTF-8''" + urllib.parse.quote(record.filename),
        },
    )


async def _record(file_id: str, request: Request, state: FacadeState) -> FileRecord:
    record = await _files(state).get(owner_of(request), file_id)
    if record is None:
        raise not_found("file", file_id, param="file_id")
    return record


def _too_large(max_bytes: int) -> APIError:
    return APIError(
        413,
        f"The file is larger than {max_bytes} bytes, this server's limit.",
        param="file",
        code="file_too_large",
    )


def _purpose(value: object) -> str:
    if value is None:
        raise APIError(
            400, "Missing required parameter: 'purpose'.", param="purpose", code="missing_required_parameter"
        )
    if not isinstance(value, str) or value not in PURPOSES:
        raise APIError(
            400,
            "Invalid value for 'purpose': this server accepts 'user_data' and 'vision'.",
            param="purpose",
            code="invalid_value",
        )
    return value


def _filename(value: str | None) -> str:
    # Only the last path segment, on one line: the name is shown to the model and in listings.
    name = (value or "").replace("\\", "/").rsplit("/", 1)[-1]
    name = "".join(char if char.isprintable() else " " for char in name).strip()
    if not name:
        raise APIError(
            400, "Invalid value for 'file': the upload has no file name.", param="file", code="invalid_value"
        )
    return name[:_MAX_FILENAME_CHARS]


async def _read_upload(upload: UploadFile, max_bytes: int) -> bytes:
    chunks: list[bytes] = []
    size = 0
    while chunk := await upload.read(_CHUNK):
        size += len(chunk)
        if size > max_bytes:
            raise _too_large(max_bytes)
        chunks.append(chunk)
    return b"".join(chunks)


def _check_kind(data: bytes, purpose: str) -> str:
    """The media type sniffed from the bytes; a 400 on `file` for a kind this server cannot read."""
    clip = sniff_clip(data)
    if clip is not None:
        if purpose == "vision":
            raise InvalidRequestError(
                f"Invalid value for 'file': purpose 'vision' takes images (PNG, JPEG, WebP, GIF); this is "
                f"{clip[0]} ({clip[1]}). Upload it with purpose 'user_data'.",
                param="file",
                code="invalid_value",
            )
        return clip[1]
    try:
        kind, media_type = sniff_file(data)
    except DocumentError as error:
        raise InvalidRequestError(
            f"Invalid value for 'file': {error.reason}.", param="file", code=error.code
        ) from None
    if purpose == "vision" and kind != "image":
        raise InvalidRequestError(
            f"Invalid value for 'file': purpose 'vision' takes images (PNG, JPEG, WebP, GIF); this is "
            f"{media_type}. Upload it with purpose 'user_data'.",
            param="file",
            code="invalid_value",
        )
    return media_type
