"""What a PDF page costs the facade: render (pypdfium2) + PNG encode + text extraction, per page.

`vlmserve.common.documents.render_pdf` on generated US Letter pages at the facade's defaults
(144 dpi, 2 Mpx cap): a text page (60 lines of Helvetica, text objects) and a scanned page (one
full-page image), plus the squares e2e page. Reports wall and CPU milliseconds per page (median of
--rounds) and PNG bytes per page. PDFium runs under one lock, so per-page CPU time bounds how many
pages per second one facade renders, whatever --translation-workers says.

    python -m bench.pdf_pages --out bench/results/pdf_pages.json
"""

from __future__ import annotations

import argparse
import io
import json
import statistics
import sys
import time
from pathlib import Path

from PIL import Image, ImageDraw

from vlmserve.common.documents import DocumentLimits, render_pdf

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests._pdfs import pdf_file  # noqa: E402

LETTER = (612, 792)  # points


def text_pdf(pages: int, lines: int = 60) -> bytes:
    """US Letter pages of Helvetica text objects."""
    objects: list[bytes] = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"",
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    kids = []
    for page in range(pages):
        body = (
            b"BT /F1 10 Tf 12 TL 40 750 Td "
            + b" ".join(
                b"(Page %d line %d: the quick brown fox jumps over the lazy dog 0123456789.) '"
                % (page + 1, line)
                for line in range(lines)
            )
            + b" ET"
        )
        objects.append(b"<< /Length %d >>\nstream\n%s\nendstream" % (len(body), body))
        content_id = len(objects)
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 %d %d] /Resources << /Font << /F1 3 0 R >> >> "
            b"/Contents %d 0 R >>" % (*LETTER, content_id)
        )
        kids.append(len(objects))
    objects[1] = b"<< /Type /Pages /Kids [%s] /Count %d >>" % (b" ".join(b"%d 0 R" % k for k in kids), pages)
    return pdf_file(objects)


def scanned_pdf(pages: int) -> bytes:
    """US Letter pages that are one 150 dpi greyscale image each (a scan)."""
    images = []
    for page in range(pages):
        image = Image.new("L", (1275, 1650), 255)
        draw = ImageDraw.Draw(image)
        for line in range(60):
            draw.text(
                (80, 80 + line * 25),
                f"Scanned page {page + 1}, line {line}: lorem ipsum dolor sit amet",
                fill=0,
            )
        images.append(image)
    buffer = io.BytesIO()
    images[0].save(buffer, format="PDF", save_all=True, append_images=images[1:], resolution=150.0)
    return buffer.getvalue()


def squares_pdf(pages: int) -> bytes:
    from training.squares import make_samples

    images = [s.image.convert("P", palette=Image.Palette.ADAPTIVE, colors=16) for s in make_samples(7, pages)]
    buffer = io.BytesIO()
    images[0].save(buffer, format="PDF", save_all=True, append_images=images[1:], resolution=144.0)
    return buffer.getvalue()


def measure(pdf: bytes, pages: int, rounds: int) -> dict[str, float]:
    walls, cpus, sizes = [], [], []
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        rendered = render_pdf(pdf, DocumentLimits(max_pages=pages))
        walls.append((time.perf_counter() - wall) * 1000 / pages)
        cpus.append((time.process_time() - cpu) * 1000 / pages)
        sizes = [len(page.png) for page in rendered]
    first = render_pdf(pdf, DocumentLimits(max_pages=pages))[0]
    return {
        "pdf_bytes": len(pdf),
        "page_pixels": f"{first.width}x{first.height}",
        "wall_ms_per_page": round(statistics.median(walls), 1),
        "cpu_ms_per_page": round(statistics.median(cpus), 1),
        "png_bytes_per_page": int(statistics.mean(sizes)),
        "text_chars_page_1": len(first.text),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--pages", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results = {
        "text page (US Letter, 60 lines)": measure(text_pdf(args.pages), args.pages, args.rounds),
        "scanned page (US Letter, 150 dpi image)": measure(scanned_pdf(args.pages), args.pages, args.rounds),
        "squares page (56 pt, the e2e test's)": measure(squares_pdf(args.pages), args.pages, args.rounds),
    }
    print(json.dumps(results, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
