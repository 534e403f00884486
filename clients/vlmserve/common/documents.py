"""Document bytes -> what a model can read: PDF pages (an image and the text of each), text, images.

The second choke point beside `images.py`, for files (`input_file`, uploaded files): the kind of a
file is sniffed from its bytes, never taken from a client's label or file name. PDFs are opened
with PDFium (pypdfium2): the page count is checked before any page is rendered, and each page is
rendered at `DocumentLimits.dpi`, scaled down to stay within `max_page_pixels` and
`max_page_side_px`; a page whose side is outside PDF's own range is refused unrendered (a 0.001 x
10^8 pt page passes any area cap and would be a 1 x 200,000,000 px bitmap). Before a page is
rendered its objects are counted and its images sized, and the JPEG streams it holds get the
image check's scan count (`images.jpeg_scan_count`). Text files are UTF-8 (a BOM is allowed)
with no binary control characters. Nothing here opens a path or a URL.

These checks cannot see everything PDFium will do (a page's content is parsed when it loads,
patterns and annotations draw too): the facade renders PDFs in worker processes under memory
and CPU limits (`vlmserve.facade.documents`); in-process callers (the client library) get the
same checks without that backstop.

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

from .images import DEFAULT_MAX_JPEG_SCANS, ImageError, header_size, jpeg_scan_count, sniff_media_type

__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "DocumentError",
    "DocumentLimits",
    "FileKind",
    "PdfPage",
    "decode_text",
    "render_pdf",
    "render_scale",
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
    """Bounds on one file, on the PDF pages one request may render and on the file bytes it reads."""

    max_bytes: int = DEFAULT_MAX_FILE_BYTES
    max_pages: int = 16
    # Rendered pixels per page (a US Letter page at 144 dpi is 1224x1584 = 1.9 Mpx).
    max_page_pixels: int = 2_000_000
    dpi: float = 144.0
    # Pages rendered per request, every file together (the request's image limit in the facade).
    max_pages_per_request: int = 64
    # Bytes of files read by id per request, every use together (the request size limit in the
    # facade): a 70-byte `file_id` part can name a 32 MB file as often as a request likes.
    max_file_bytes_per_request: int = 64 * 2**20
    # Checked on each page before it is rendered (PDFium decodes embedded images in full, and
    # draws every object): bombs of either kind are refused unrendered.
    max_page_objects: int = 100_000
    max_embedded_image_pixels: int = 50_000_000
    # Start-of-scan segments in one embedded JPEG (as for images: images.DEFAULT_MAX_JPEG_SCANS).
    max_embedded_jpeg_scans: int = DEFAULT_MAX_JPEG_SCANS
    # Each side of a page, in points: PDF's own range is 3 to 14,400 (ISO 32000, annex C).
    min_page_side_pt: float = 1.0
    max_page_side_pt: float = 14_400.0
    # Each side of a rendered page, in pixels (the area cap alone lets one side be huge).
    max_page_side_px: int = 8_192


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


def render_scale(width_pt: float, height_pt: float, limits: DocumentLimits, max_pixels: int) -> float:
    """Pixels per point for a page: `limits.dpi`, less where the page would pass the pixel cap
    (its area) or `max_page_side_px` (either side). Never more than `limits.dpi` asks."""
    scale = min(limits.dpi / 72.0, limits.max_page_side_px / max(width_pt, height_pt))
    if width_pt * height_pt * scale * scale > max_pixels:
        scale = math.sqrt(max_pixels / (width_pt * height_pt))
    # A little under the exact bound: rendered sizes are rounded up.
    return scale * 0.995 if scale < limits.dpi / 72.0 else scale


def _check_page_sides(width_pt: float, height_pt: float, index: int, limits: DocumentLimits) -> None:
    """Both sides within PDF's range: outside it, no scale gives a page both readable and bounded
    (a side of 0.001 pt needs 72,000 dpi to be one pixel wide, 10^8 pt is 200 Mpx at 144 dpi)."""
    for side, name in ((width_pt, "width"), (height_pt, "height")):
        if not limits.min_page_side_pt <= side <= limits.max_page_side_pt:
            raise DocumentError(
                f"page {index + 1} of the PDF has a {name} of {side:g} pt; pages are "
                f"{limits.min_page_side_pt:g} to {limits.max_page_side_pt:g} pt a side",
                code="invalid_file" if side < limits.min_page_side_pt else "file_too_large",
            )


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
            _check_image(item, item.get_px_size(), index, limits)


def _check_image(image: Any, size: tuple[int, int], index: int, limits: DocumentLimits) -> None:
    """An embedded image's size (from its dictionary, and from a JPEG's own header, which is what
    the decoder believes) and a JPEG's scan count, before PDFium decodes it."""
    _check_image_size(size, index, limits)
    if "DCTDecode" not in image.get_filters():
        return
    # The stream with its other filters (Flate, ASCII85...) undone: the JPEG's own bytes.
    jpeg = bytes(image.get_data(decode_simple=True))
    if jpeg_scan_count(jpeg) > limits.max_embedded_jpeg_scans:
        raise DocumentError(
            f"page {index + 1} of the PDF holds a JPEG with more than {limits.max_embedded_jpeg_scans} "
            "scans (the limit)",
            code="file_too_complex",
        )
    try:
        _check_image_size(header_size(jpeg), index, limits)
    except ImageError as error:
        # Unreadable headers are left to PDFium (which tolerates more); too large is refused.
        if error.code == "image_too_large":
            raise DocumentError(
                f"page {index + 1} of the PDF holds a JPEG with too many pixels", code="file_too_large"
            ) from None


def _check_image_size(size: tuple[int, int], index: int, limits: DocumentLimits) -> None:
    width, height = size
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

    try:
        page = document[index]
    except pdfium.PdfiumError:
        raise DocumentError(f"page {index + 1} of the PDF could not be loaded", code="invalid_file") from None
    try:
        width_pt, height_pt = page.get_size()
        _check_page_sides(width_pt, height_pt, index, limits)
        _check_page_objects(page, index, limits)
        bitmap = page.render(scale=render_scale(width_pt, height_pt, limits, max_pixels))
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
