"""The PDF rendering worker: one process, one PDF, under memory and CPU limits, then it exits.

Started by `pdf_workers.PdfWorkers` as a script (`python -P pdf_worker_main.py MEMORY_BYTES CPU_S`), so
that it imports only PDFium, Pillow and `vlmserve.common.documents`, never the facade. Its
limits are set before it reads a byte of the PDF: RLIMIT_AS (address space: PDFium's allocations
fail, or it aborts, and only this process dies), RLIMIT_CPU (SIGXCPU, then SIGKILL), no core
files, no files written. One job per process: nothing a PDF leaves in memory outlives it.

The wire format is data, in both directions (never pickle: the answer comes from a process that
parsed hostile bytes): a frame is a 4-byte big-endian length and a JSON header, then for a job
the PDF's bytes (their length in the header), for an answer each page's PNG bytes in order.
This module is also what the parent imports for the framing.
"""

from __future__ import annotations

import json
import select
import struct
import sys
from dataclasses import asdict, fields
from typing import Any, BinaryIO

from vlmserve.common.documents import DocumentError, DocumentLimits, PdfPage, render_pdf

_LENGTH = struct.Struct(">I")
# How long a started worker waits for its job before it exits.
SPARE_IDLE_S = 60.0
# A job's or an answer's header: limits and page metadata, never the bytes themselves.
MAX_HEADER_BYTES = 16 * 1024 * 1024


def job_frame(data: bytes, limits: DocumentLimits, *, max_pixels: int | None, max_pages: int | None) -> bytes:
    header = {"limits": asdict(limits), "max_pixels": max_pixels, "max_pages": max_pages, "bytes": len(data)}
    encoded = json.dumps(header).encode()
    return _LENGTH.pack(len(encoded)) + encoded + data


def answer_frame(pages: list[PdfPage] | DocumentError) -> bytes:
    if isinstance(pages, DocumentError):
        header: dict[str, Any] = {"ok": False, "reason": pages.reason, "code": pages.code}
        payload = b""
    else:
        header = {
            "ok": True,
            "pages": [
                {"number": p.number, "text": p.text, "width": p.width, "height": p.height, "png": len(p.png)}
                for p in pages
            ],
        }
        payload = b"".join(page.png for page in pages)
    encoded = json.dumps(header).encode()
    return _LENGTH.pack(len(encoded)) + encoded + payload


def parse_answer(frame: bytes) -> list[PdfPage]:
    """An answer frame -> the pages, or the DocumentError the worker reported. ValueError for
    anything malformed (a worker that misbehaves is refused like one that crashed)."""
    header, rest = _split(frame)
    if header.get("ok") is False:
        raise DocumentError(str(header.get("reason", "the PDF could not be read"))[:500], code=_code(header))
    pages: list[PdfPage] = []
    offset = 0
    for entry in header["pages"]:
        size = int(entry["png"])
        png = rest[offset : offset + size]
        if len(png) != size:
            raise ValueError("short answer")
        offset += size
        pages.append(
            PdfPage(
                number=int(entry["number"]),
                text=str(entry["text"]),
                png=png,
                width=int(entry["width"]),
                height=int(entry["height"]),
            )
        )
    if offset != len(rest):
        raise ValueError("trailing bytes")
    return pages


def frame_length(buffer: bytes | bytearray) -> int | None:
    """How long the answer frame starting in `buffer` is, once its header is in (else None)."""
    if len(buffer) < _LENGTH.size:
        return None
    size: int = _LENGTH.unpack_from(buffer)[0]
    if size > MAX_HEADER_BYTES:
        raise ValueError("header too large")
    end = _LENGTH.size + size
    if len(buffer) < end:
        return None
    header = json.loads(bytes(buffer[_LENGTH.size : end]))
    if header.get("ok") is False:
        return end
    return end + sum(int(entry["png"]) for entry in header["pages"])


def _split(frame: bytes) -> tuple[dict[str, Any], bytes]:
    (size,) = _LENGTH.unpack_from(frame)
    if size > MAX_HEADER_BYTES:
        raise ValueError("header too large")
    header = json.loads(frame[_LENGTH.size : _LENGTH.size + size])
    if not isinstance(header, dict):
        raise ValueError("header is not an object")
    return header, frame[_LENGTH.size + size :]


def _code(header: dict[str, Any]) -> str:
    code = header.get("code")
    return code if code in ("invalid_file", "file_too_large", "file_too_complex") else "invalid_file"


def _read_exactly(stream: BinaryIO, size: int) -> bytes:
    data = stream.read(size)
    if len(data) != size:
        raise EOFError
    return data


def _limit(memory_bytes: int, cpu_s: int) -> None:
    import resource

    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))
    resource.setrlimit(resource.RLIMIT_AS, (memory_bytes, memory_bytes))
    # SIGXCPU at the soft limit (its default action ends the process), SIGKILL a second later.
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s + 1))


def serve(memory_bytes: int, cpu_s: int) -> None:
    import pypdfium2  # noqa: F401  # loaded before the limits: its size is not the PDF's cost

    _limit(memory_bytes, cpu_s)
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    # A spare nobody gave a job to goes by itself (the pool takes only younger ones).
    ready, _, _ = select.select([source], [], [], SPARE_IDLE_S)
    if not ready:
        return
    (size,) = _LENGTH.unpack(_read_exactly(source, _LENGTH.size))
    header = json.loads(_read_exactly(source, min(size, MAX_HEADER_BYTES)))
    known = {field.name for field in fields(DocumentLimits)}
    limits = DocumentLimits(**{key: value for key, value in header["limits"].items() if key in known})
    data = _read_exactly(source, int(header["bytes"]))
    try:
        answer: list[PdfPage] | DocumentError = render_pdf(
            data, limits, max_pixels=header["max_pixels"], max_pages=header["max_pages"]
        )
    except DocumentError as error:
        answer = error
    except MemoryError:
        answer = DocumentError(
            f"rendering the PDF needed more than {memory_bytes // 2**20} MiB of memory, the limit",
            code="file_too_large",
        )
    del data
    sink.write(answer_frame(answer))
    sink.flush()


if __name__ == "__main__":
    serve(int(sys.argv[1]), int(sys.argv[2]))
