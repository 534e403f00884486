"""Small hostile PDFs, written byte by byte (`tests._pdfs.pdf_file`): each one is a finding of a
review (docs/hardening.md, "Files and PDFs")."""

from __future__ import annotations

from tests._pdfs import pdf_file

_CATALOG = b"<< /Type /Catalog /Pages 2 0 R >>"


def page_pdf(width_pt: float, height_pt: float) -> bytes:
    """One empty page of this size (a 0.001 x 10^8 pt page passes any area cap)."""
    return pdf_file(
        [
            _CATALOG,
            b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %s %s] >>"
            % (repr(width_pt).encode(), repr(height_pt).encode()),
        ]
    )


def unloadable_page_pdf() -> bytes:
    """Two pages listed, the second an object that does not exist: PDFium fails to load it."""
    return pdf_file(
        [
            _CATALOG,
            b"<< /Type /Pages /Kids [3 0 R 9 0 R] /Count 2 >>",
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 100 100] >>",
        ]
    )


def jpeg_pdf(jpeg: bytes, *, width: int, height: int, pages: int = 1) -> bytes:
    """`pages` pages each drawing one embedded JPEG stream (DCTDecode) whose dictionary says
    width x height (what the JPEG's own header says may differ)."""
    page_ids = [4 + 2 * index for index in range(pages)]
    kids = b" ".join(b"%d 0 R" % page_id for page_id in page_ids)
    objects = [
        _CATALOG,
        b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, pages),
        b"<< /Type /XObject /Subtype /Image /Width %d /Height %d /ColorSpace /DeviceRGB "
        b"/BitsPerComponent 8 /Filter /DCTDecode /Length %d >>\nstream\n%s\nendstream"
        % (width, height, len(jpeg), jpeg),
    ]
    draw = b"q 100 0 0 100 0 0 cm /Im0 Do Q"
    for page_id in page_ids:
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 100 100] "
            b"/Resources << /XObject << /Im0 3 0 R >> >> /Contents %d 0 R >>" % (page_id + 1)
        )
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(draw), draw))
    return pdf_file(objects)


def nested_forms_pdf(depth: int = 24, fanout: int = 4) -> bytes:
    """A page drawing form 1, each form drawing the next `fanout` times, `depth` deep: fanout **
    depth drawings from a file of about 150 bytes per form (deeper than any object walk looks)."""
    first_form = 5
    objects = [
        _CATALOG,
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 100 100] "
        b"/Resources << /XObject << /F 5 0 R >> >> /Contents 4 0 R >>",
    ]
    draw = b"/F Do"
    objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(draw), draw))
    for level in range(depth):
        number = first_form + level
        if level + 1 < depth:
            body = b" ".join([b"q 0.9 0 0 0.9 1 1 cm /F Do Q"] * fanout)
            resources = b"/Resources << /XObject << /F %d 0 R >> >>" % (number + 1)
        else:
            body, resources = b"0 0 100 100 re f", b""
        objects.append(
            b"<< /Type /XObject /Subtype /Form /BBox [0 0 100 100] %s /Length %d >>\nstream\n%s\nendstream"
            % (resources, len(body), body)
        )
    return pdf_file(objects)
