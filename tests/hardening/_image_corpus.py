"""Odd, hostile and unusual images for the malformed-input corpus, built in memory."""

from __future__ import annotations

import io
import struct
import zlib

from PIL import Image


def _save(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def png(size: tuple[int, int] = (8, 8), mode: str = "RGB") -> bytes:
    return _save(Image.new(mode, size), "PNG")


def one_by_one() -> bytes:
    return png((1, 1))


def png_16_bit() -> bytes:
    image = Image.new("I;16", (8, 8))
    image.putdata([index * 1000 for index in range(64)])
    return _save(image, "PNG")


def cmyk_jpeg() -> bytes:
    return _save(Image.new("CMYK", (8, 8), (0, 255, 255, 0)), "JPEG")


def exif_rotated_jpeg() -> bytes:
    """8 wide, 4 high, with EXIF orientation 6 (shown rotated: 4 wide, 8 high)."""
    exif = Image.Exif()
    exif[0x0112] = 6
    return _save(Image.new("RGB", (8, 4), (10, 200, 10)), "JPEG", exif=exif.tobytes())


def animated_gif() -> bytes:
    frames = [Image.new("P", (8, 8), color) for color in (1, 2, 3)]
    return _save(frames[0], "GIF", save_all=True, append_images=frames[1:], duration=50, loop=0)


def webp() -> bytes:
    return _save(Image.new("RGB", (8, 8), (1, 2, 3)), "WEBP")


def palette_png_with_transparency() -> bytes:
    image = Image.new("P", (8, 8), 1)
    return _save(image, "PNG", transparency=1)


def _chunk(kind: bytes, body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))


def png_bomb(width: int = 20_000, height: int = 20_000) -> bytes:
    """A real 1-bit PNG of width x height black pixels: ~50 MB of raw rows compressing to ~50 kB;
    decoded by Pillow it would take width*height bytes (400 MB), as RGB three times that."""
    row = b"\x00" * (1 + (width + 7) // 8)
    compressor = zlib.compressobj(9)
    rows_per_batch = 1000
    compressed = [compressor.compress(row * rows_per_batch) for _ in range(height // rows_per_batch)]
    compressed.append(compressor.compress(row * (height % rows_per_batch)))
    compressed.append(compressor.flush())
    header = struct.pack(">IIBBBBB", width, height, 1, 0, 0, 0, 0)
    return (
        b"\x89PNG\r\n\x1a\n"
        + _chunk(b"IHDR", header)
        + _chunk(b"IDAT", b"".join(compressed))
        + _chunk(b"IEND", b"")
    )


def jpeg_claiming(width: int, height: int) -> bytes:
    """A small JPEG whose frame header (SOF0) claims width x height."""
    data = bytearray(_save(Image.new("RGB", (8, 8)), "JPEG"))
    at = data.index(b"\xff\xc0")
    data[at + 5 : at + 9] = struct.pack(">HH", height, width)
    return bytes(data)


def _jpeg_segments(data: bytes) -> list[bytes]:
    """A JPEG split into its segments after SOI (a scan with its entropy-coded data), EOI last."""
    segments: list[bytes] = []
    position = 2
    while position < len(data):
        marker = data[position + 1]
        if marker == 0xD9:
            segments.append(data[position:])
            break
        end = position + 2 + struct.unpack(">H", data[position + 2 : position + 4])[0]
        if marker == 0xDA:
            while not (data[end] == 0xFF and data[end + 1] not in (0x00, *range(0xD0, 0xD8))):
                end += 1
        segments.append(data[position:end])
        position = end
    return segments


def jpeg_scan_bomb(width: int = 7000, height: int = 7000, scans: int = 2000) -> bytes:
    """A progressive JPEG whose header claims width x height (legal: under the pixel limit) and
    whose last refinement scan (with its Huffman table) repeats `scans` times: a few kB per
    hundred scans, each a pass over every block when decoded (~4 ms a scan at 7000x7000)."""
    data = _save(Image.new("RGB", (16, 16), (120, 30, 200)), "JPEG", progressive=True, quality=90)
    segments = _jpeg_segments(data)
    for index, segment in enumerate(segments):
        if segment[1] == 0xC2:  # SOF2: progressive frame header
            patched = bytearray(segment)
            patched[5:9] = struct.pack(">HH", height, width)
            segments[index] = bytes(patched)
    eoi = segments.pop()
    last_scan = segments[-2] + segments[-1]  # DHT + SOS
    return b"\xff\xd8" + b"".join(segments) + last_scan * scans + eoi


def gif_claiming(width: int, height: int) -> bytes:
    """A small GIF whose logical screen claims width x height."""
    data = bytearray(_save(Image.new("P", (8, 8)), "GIF"))
    data[6:10] = struct.pack("<HH", width, height)
    return bytes(data)


def bmp() -> bytes:
    return _save(Image.new("RGB", (8, 8)), "BMP")


def tiff() -> bytes:
    return _save(Image.new("RGB", (8, 8)), "TIFF")


SVG = b'<svg xmlns="http://www.w3.org/2000/svg" width="8" height="8"><rect width="8" height="8"/></svg>'
