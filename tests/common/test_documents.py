"""vlmserve.common.documents: a file's kind from its bytes, PDF pages, text."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
from PIL import Image

from tests._pdfs import images_pdf, text_pdf
from tests.responses.responses_testkit import RED
from vlmserve.common.documents import DocumentError, DocumentLimits, decode_text, render_pdf, sniff_file

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
