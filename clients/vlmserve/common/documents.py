"""Document bytes -> what a model can read: PDF pages (an image and the text of each), text, images.

The second choke point beside `images.py`, for files (`input_file`, uploaded files): the kind of a
file is sniffed from its bytes, never taken from a client's label or file name. PDFs are opened
with PDFium (pypdfium2): the page count is checked before any page is rendered, and each page is
rendered at `DocumentLimits.dpi`, scaled down to stay within `max_page_pixels`. Text files are
UTF-8 (a BOM is allowed) with no binary control characters. Nothing here opens a path or a URL.

PDFium is not thread-safe (not even across documents), so every call into it holds one lock
(per page, not per document: pages of several requests interleave).
"""

from __future__ import annotations

import io
import math
import threading
from dataclasses import dataclass
from typing import Any, Literal

from PIL import Image

from .images import sniff_media_type

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "DocumentError",
    "DocumentLimits",
    "FileKind",
    "PdfPage",
    "decode_text",
    "render_pdf",
    "sniff_file",
]

DEFAULT_MAX_FILE_BYTES = 32 * 1024 * 1024
FileKind = Literal["pdf", "image", "text"]

# Control characters that never appear in text files (tab, newline, carriage return, form feed
# and escape do).
_BINARY_CONTROLS = frozenset(range(0x20)) - {0x09, 0x0A, 0x0C, 0x0D, 0x1B}
# Signatures of common binary formats, only to name them in an error.
_KNOWN_BINARY: tuple[tuple[bytes, str], ...] = (
    (b"PK\x03\x04", "application/zip (docx, xlsx, pptx and other zip containers)"),
    (b"\x1f\x8b", "application/gzip"),
    (b"\xd0\xcf\x11\xe0", "application/x-ole-storage (doc, xls, ppt)"),
    (b"{\\rtf", "application/rtf"),
    (b"ID3", "audio/mpeg"),
    (b"OggS", "audio/ogg"),
    (b"\x7fELF", "application/x-executable"),
    (b"MZ", "application/x-msdownload"),
    (b"BM", "image/bmp"),
    (b"II*\x00", "image/tiff"),
    (b"MM\x00*", "image/tiff"),
)
# PDF readers accept the header anywhere in the first 1024 bytes.
_PDF_HEADER_WINDOW = 1024

_PDFIUM_LOCK = threading.Lock()


class DocumentError(ValueError):
    """Bytes that are not a file this server can read. `reason` is short and safe to show a client."""

    def __init__(self, reason: str, *, code: str = "invalid_file") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


@dataclass(frozen=True, slots=True)
class DocumentLimits:
    """Bounds on one file and on the PDF pages one request may render."""

    max_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_pages: int = 16
    # Rendered pixels per page (a US Letter page at 144 dpi is 1224x1584 = 1.9 Mpx).
    max_page_pixels: int = 2_000_000
    dpi: float = 144.0
    # Pages rendered per request, every file together (the request's image limit in the facade).
    max_pages_per_request: int = 64
    # Checked on each page before it is rendered (PDFium decodes embedded images in full, and
    # draws every object): bombs of either kind are refused unrendered.
    max_page_objects: int = 100_000
    max_embedded_image_pixels: int = 50_000_000


@dataclass(frozen=True, slots=True)
class PdfPage:
    number: int  # from 1
    text: str
    png: bytes
    width: int
    height: int


def sniff_file(data: bytes) -> tuple[FileKind, str]:
    """(kind, media type) of a file's bytes; DocumentError naming the type when it is none we read."""
    if not data:
        raise DocumentError("the file is empty", code="invalid_file")
    if b"%PDF-" in data[:_PDF_HEADER_WINDOW]:
        return "pdf", "application/pdf"
    image_type = sniff_media_type(data)
    if image_type is not None:
        return "image", image_type
    if decode_text(data) is not None:
        return "text", "text/plain"
    raise DocumentError(
        f"unsupported file type ({_binary_type(data)}); accepted: PDF, images (PNG, JPEG, WebP, GIF) "
        "and UTF-8 text (txt, md, csv, json, source code)",
        code="unsupported_file",
    )


def _binary_type(data: bytes) -> str:
    for signature, name in _KNOWN_BINARY:
        if data.startswith(signature):
            return name
    return "application/octet-stream"


def decode_text(data: bytes) -> str | None:
    """The text of a UTF-8 text file (BOM allowed), or None when the bytes are not text."""
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        return None
    if any(ord(char) in _BINARY_CONTROLS for char in text[:65536]) or "\x00" in text:
        return None
    return text


def render_pdf(
    data: bytes, limits: DocumentLimits, *, max_pixels: int | None = None, max_pages: int | None = None
) -> list[PdfPage]:
    """Every page of a PDF as a PNG (at `limits.dpi`, within the pixel caps) and its text.

    `max_pixels` and `max_pages`, when given, cap pixels per page and pages further (what the
    caller has left). Raises DocumentError for an unreadable or encrypted PDF and for one with
    more pages than allowed, before any page is rendered.
    """
    cap = min(limits.max_page_pixels, max_pixels or limits.max_page_pixels)
    with _PDFIUM_LOCK:
        document = _open(data)
    try:
        with _PDFIUM_LOCK:
            count = len(document)
        _check_page_count(count, limits, max_pages)
        pages = []
        for index in range(count):
            # The lock is held per page, for PDFium's part only: other requests' pages interleave,
            # and the PNG encoding (most of the time) runs outside it.
            with _PDFIUM_LOCK:
                image, text = _render_page(document, index, limits, cap)
            buffer = io.BytesIO()
            # Level 1: half the encode time of the default here, and no larger on text pages.
            image.save(buffer, format="PNG", compress_level=1)
            pages.append(
                PdfPage(
                    number=index + 1, text=text, png=buffer.getvalue(), width=image.width, height=image.height
                )
            )
        return pages
    finally:
        with _PDFIUM_LOCK:
            document.close()


def _open(data: bytes) -> Any:
    import pypdfium2 as pdfium  # here: only PDF requests pay for loading PDFium

    try:
        return pdfium.PdfDocument(data)
    except pdfium.PdfiumError as error:
        encrypted = "password" in str(error).lower()
        reason = "the PDF is encrypted" if encrypted else "the PDF could not be read"
        raise DocumentError(reason, code="invalid_file") from None


def _check_page_objects(page: Any, index: int, limits: DocumentLimits) -> None:
    """Count the page's objects (into form XObjects too) and size its images, before rendering."""
    import pypdfium2.raw as pdfium_c

    for count, item in enumerate(page.get_objects(max_depth=8), start=1):
        if count > limits.max_page_objects:
            raise DocumentError(
                f"page {index + 1} of the PDF has more than {limits.max_page_objects} objects",
                code="file_too_complex",
            )
        if item.type == pdfium_c.FPDF_PAGEOBJ_IMAGE:
            width, height = item.get_px_size()
            if width * height > limits.max_embedded_image_pixels:
                raise DocumentError(
                    f"page {index + 1} of the PDF holds a {width}x{height} image, over the limit of "
                    f"{limits.max_embedded_image_pixels} pixels",
                    code="file_too_large",
                )


def _check_page_count(count: int, limits: DocumentLimits, max_pages: int | None) -> None:
    if count == 0:
        raise DocumentError("the PDF has no pages", code="invalid_file")
    if count > limits.max_pages:
        raise DocumentError(
            f"the PDF has {count} pages, over the limit of {limits.max_pages}", code="file_too_large"
        )
    if max_pages is not None and count > max_pages:
        raise DocumentError(
            f"the PDF has {count} pages, more than this request may still render "
            f"({max_pages} of {limits.max_pages_per_request})",
            code="file_too_large",
        )


def _render_page(
    document: Any, index: int, limits: DocumentLimits, max_pixels: int
) -> tuple[Image.Image, str]:
    """One page as an RGB image and its text (call with the lock held)."""
    import pypdfium2 as pdfium

    page = document[index]
    try:
        width_pt, height_pt = page.get_size()
        if width_pt <= 0 or height_pt <= 0:
            raise DocumentError(f"page {index + 1} of the PDF has no area", code="invalid_file")
        _check_page_objects(page, index, limits)
        scale = limits.dpi / 72.0
        if width_pt * height_pt * scale * scale > max_pixels:
            # A little under the exact root: rendered sizes are rounded up.
            scale = math.sqrt(max_pixels / (width_pt * height_pt)) * 0.995
        bitmap = page.render(scale=scale)
        image = bitmap.to_pil().convert("RGB")
        bitmap.close()
        text_page = page.get_textpage()
        try:
            text = text_page.get_text_range().replace("\r\n", "\n").strip()
        finally:
            text_page.close()
        return image, text
    except pdfium.PdfiumError:
        reason = f"page {index + 1} of the PDF could not be rendered"
        raise DocumentError(reason, code="invalid_file") from None
    finally:
        page.close()
