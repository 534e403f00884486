"""PDFs made in tests: squares images as pages (lossless), and pages of plain text."""

from __future__ import annotations

import io
from collections.abc import Sequence

from PIL import Image

from training.squares import SquaresSample

# Rendered at the facade's default 144 dpi, a page of IMAGE_SIZE / 2 points is the squares image
# pixel for pixel.
SQUARES_DPI = 144.0


def images_pdf(images: Sequence[Image.Image], *, dpi: float = SQUARES_DPI) -> bytes:
    """One page per image. Palette images: Pillow stores them losslessly (RGB would be JPEG)."""
    pages = [image.convert("P", palette=Image.Palette.ADAPTIVE, colors=16) for image in images]
    buffer = io.BytesIO()
    pages[0].save(buffer, format="PDF", save_all=True, append_images=pages[1:], resolution=dpi)
    return buffer.getvalue()


def squares_pdf(samples: Sequence[SquaresSample]) -> bytes:
    """A PDF whose page N is sample N's squares image."""
    return images_pdf([sample.image for sample in samples])


def text_pdf(pages: Sequence[str]) -> bytes:
    """A PDF with one line of Helvetica text per page (ASCII without parentheses or backslashes)."""
    objects: list[bytes] = []
    page_ids = [4 + 2 * index for index in range(len(pages))]
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    kids = b" ".join(b"%d 0 R" % page_id for page_id in page_ids)
    objects.append(b"<< /Type /Pages /Kids [%s] /Count %d >>" % (kids, len(pages)))
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for page_id, text in zip(page_ids, pages, strict=True):
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 300 200] /Resources << /Font << /F1 3 0 R >> >> "
            b"/Contents %d 0 R >>" % (page_id + 1)
        )
        stream = b"BT /F1 14 Tf 20 100 Td (%s) Tj ET" % text.encode("ascii")
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream))
    return pdf_file(objects)


def pdf_file(objects: Sequence[bytes]) -> bytes:
    """A PDF of these objects (numbered from 1; object 1 is the catalog), with its xref table."""
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for number, body in enumerate(objects, start=1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n%s\nendobj\n" % (number, body))
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    out.writelines(b"%010d 00000 n \n" % offset for offset in offsets)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objects) + 1, xref))
    return out.getvalue()


def split_pages(pdf: bytes) -> list[bytes]:
    """Each page of a PDF as a PDF of its own (pypdfium2 copies the page, nothing re-rendered)."""
    import pypdfium2 as pdfium

    source = pdfium.PdfDocument(pdf)
    try:
        pages = []
        for index in range(len(source)):
            single = pdfium.PdfDocument.new()
            single.import_pages(source, [index])
            buffer = io.BytesIO()
            single.save(buffer)
            single.close()
            pages.append(buffer.getvalue())
        return pages
    finally:
        source.close()
