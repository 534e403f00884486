"""vlmserve.common.documents: a file's kind from its bytes, PDF pages, text."""

from __future__ import annotations

import io
import math
from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image

from tests._hostile_pdfs import jpeg_pdf, page_pdf, unloadable_page_pdf
from tests._pdfs import images_pdf, text_pdf
from tests.hardening._image_corpus import jpeg_claiming, jpeg_scan_bomb
from tests.responses.responses_testkit import RED
from vlmserve.common.documents import (
    DocumentError,
    DocumentLimits,
    decode_text,
    render_pdf,
    render_scale,
    sniff_file,
)

PDF = text_pdf(["one", "two", "three"])
IMAGE_PAGE = images_pdf([Image.new("RGB", (120, 100))])  # one embedded 120x100 image


@pytest.mark.parametrize(
    ("data", "kind", "media_type"),
    [
        (PDF, "pdf", "application/pdf"),
        (b"\n\n" + PDF, "pdf", "application/pdf"),  # the header anywhere in the first KiB
        (RED, "image", "image/png"),
        (b'{"a": 1}\n', "text", "text/plain"),
        ("﻿héllo, wörld\r\n\tindented\n".encode(), "text", "text/plain"),
        (b"def f():\n    return '\x1b[1m'\n", "text", "text/plain"),
    ],
    ids=["pdf", "pdf-late-header", "png", "json", "utf8-bom", "source-with-escape"],
)
def test_kinds_are_sniffed(data: bytes, kind: str, media_type: str) -> None:
    assert sniff_file(data) == (kind, media_type)


@pytest.mark.parametrize(
    ("data", "named"),
    [
        (b"PK\x03\x04" + bytes(30), "application/zip"),
        (b"\x1f\x8b\x08" + bytes(30), "application/gzip"),
        ("hello".encode("utf-16"), "application/octet-stream"),
        (b"text with a \x00 NUL", "application/octet-stream"),
        (b"\xff\xfe\xfa latin-1 \xe9", "application/octet-stream"),
        (b"BM" + bytes(60), "image/bmp"),
    ],
    ids=["zip", "gzip", "utf16", "nul", "not-utf8", "bmp"],
)
def test_other_kinds_are_refused_by_name(data: bytes, named: str) -> None:
    with pytest.raises(DocumentError) as caught:
        sniff_file(data)
    assert caught.value.code == "unsupported_file" and named in caught.value.reason


def test_decode_text_strips_the_bom() -> None:
    assert decode_text("﻿abc".encode()) == "abc"


def test_pages_render_the_same_from_many_threads() -> None:
    """PDFium is not thread-safe: the lock makes concurrent requests' renders correct."""
    expected = render_pdf(PDF, DocumentLimits())
    with ThreadPoolExecutor(max_workers=6) as pool:
        results = list(pool.map(lambda _: render_pdf(PDF, DocumentLimits()), range(12)))
    assert all(result == expected for result in results)
    assert [page.text for page in expected] == ["one", "two", "three"]


def test_page_pixels_are_capped() -> None:
    (page, *_) = render_pdf(PDF, DocumentLimits(max_page_pixels=30_000))
    assert page.width * page.height <= 30_000
    assert abs(page.width / page.height - 1.5) < 0.02  # the page's aspect kept


@pytest.mark.parametrize(
    ("pdf", "limits", "code"),
    [
        (PDF, DocumentLimits(max_page_objects=0), "file_too_complex"),
        (IMAGE_PAGE, DocumentLimits(max_embedded_image_pixels=11_999), "file_too_large"),
    ],
    ids=["objects", "embedded-image"],
)
def test_page_bombs_are_refused_before_rendering(pdf: bytes, limits: DocumentLimits, code: str) -> None:
    with pytest.raises(DocumentError) as caught:
        render_pdf(pdf, limits)
    assert caught.value.code == code and "page 1" in caught.value.reason


def test_embedded_images_within_the_limit_render() -> None:
    (page,) = render_pdf(IMAGE_PAGE, DocumentLimits(max_embedded_image_pixels=12_000))
    assert (page.width, page.height) == (120, 100)


# ---- hostile PDFs (issue 26: a review's findings, each refused before PDFium renders) ------------


@pytest.mark.parametrize(
    ("width_pt", "height_pt", "code", "named"),
    [
        (0.001, 1e8, "invalid_file", "width of 0.001 pt"),  # 1 x 200,000,000 px at 144 dpi
        (1e8, 0.001, "file_too_large", "width of 1e+08 pt"),
        (100.0, 20_000.0, "file_too_large", "height of 20000 pt"),
        (0.5, 0.5, "invalid_file", "width of 0.5 pt"),
    ],
    ids=["thin-and-tall", "wide-and-flat", "over-pdf-range", "tiny"],
)
def test_pages_with_a_side_out_of_range_are_refused(
    width_pt: float, height_pt: float, code: str, named: str
) -> None:
    with pytest.raises(DocumentError) as caught:
        render_pdf(page_pdf(width_pt, height_pt), DocumentLimits())
    assert caught.value.code == code and named in caught.value.reason and "page 1" in caught.value.reason


def test_each_rendered_side_is_bounded_not_only_the_area() -> None:
    """A legal 14,400 x 3 pt strip is 28,800 x 6 px at 144 dpi (0.17 Mpx, under the area cap):
    scaled to `max_page_side_px` instead."""
    (page,) = render_pdf(page_pdf(14_400, 3), DocumentLimits(max_page_side_px=4096))
    assert page.width <= 4096 and page.height >= 1


def test_render_scale_never_passes_either_bound() -> None:
    limits = DocumentLimits(max_page_side_px=1000)
    for width_pt, height_pt in [(1, 14_400), (14_400, 14_400), (612, 792), (3, 3)]:
        scale = render_scale(width_pt, height_pt, limits, limits.max_page_pixels)
        width, height = math.ceil(width_pt * scale), math.ceil(height_pt * scale)
        assert max(width, height) <= 1000 and width * height <= limits.max_page_pixels
        assert scale <= limits.dpi / 72


def test_a_page_that_fails_to_load_is_a_document_error() -> None:
    with pytest.raises(DocumentError) as caught:
        render_pdf(unloadable_page_pdf(), DocumentLimits())
    assert caught.value.code == "invalid_file" and "page 2" in caught.value.reason


def test_embedded_jpeg_scan_bombs_are_refused_before_decoding() -> None:
    bomb = jpeg_pdf(jpeg_scan_bomb(2000, 2000, scans=500), width=2000, height=2000)
    with pytest.raises(DocumentError) as caught:
        render_pdf(bomb, DocumentLimits())
    assert caught.value.code == "file_too_complex" and "more than 64 scans" in caught.value.reason


def test_embedded_jpeg_sizes_are_read_from_the_jpeg_header_too() -> None:
    """The dictionary says 10 x 10; the JPEG's own header (what the decoder uses) says 8000 x 8000."""
    lying = jpeg_pdf(jpeg_claiming(8000, 8000), width=10, height=10)
    with pytest.raises(DocumentError) as caught:
        render_pdf(lying, DocumentLimits())
    assert caught.value.code == "file_too_large" and "8000x8000" in caught.value.reason


def test_ordinary_embedded_jpegs_render() -> None:
    buffer = io.BytesIO()
    Image.new("RGB", (64, 48), (200, 30, 30)).save(buffer, format="JPEG", progressive=True)
    (page,) = render_pdf(jpeg_pdf(buffer.getvalue(), width=64, height=48), DocumentLimits())
    red, green, _ = Image.open(io.BytesIO(page.png)).convert("RGB").getpixel((100, 100))  # type: ignore[misc]
    assert (page.width, page.height) == (200, 200) and red > 150 and green < 80
