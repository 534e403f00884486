"""Image bytes checks shared by the facade and the engine.

One choke point for turning untrusted bytes into something a model may see:
the media type is sniffed from the bytes (never taken from a client's label
alone), the pixel count is bounded from the header before any full decode, a
JPEG's scans are counted before any decode (each progressive scan costs a pass
over every block, so a small file with thousands of empty scans is a CPU bomb),
and only a fixed set of formats is accepted. Nothing here opens a path or a URL.

`decode_image(..., min_size=...)` decodes big images straight to a smaller
size (JPEG DCT scaling, then an integer box reduction) so that a 7000x7000
screenshot never lives in memory at full size longer than its decode.
"""

from __future__ import annotations

import base64
import binascii
import io
import re
from dataclasses import dataclass

from PIL import Image, ImageOps, UnidentifiedImageError

__all__ = [
    "DEFAULT_MAX_IMAGE_BYTES",
    "DEFAULT_MAX_JPEG_SCANS",
    "SUPPORTED_MEDIA_TYPES",
    "ImageError",
    "ImageInfo",
    "ImageLimits",
    "decode_image",
    "header_size",
    "inspect_image",
    "jpeg_scan_count",
    "parse_data_url",
    "sniff_media_type",
]

DEFAULT_MAX_IMAGE_BYTES = 20 * 1024 * 1024
# libjpeg writes 10 scans for a progressive colour JPEG, mozjpeg about as many; each scan is
# a pass over every 8x8 block (~5 ms per scan at 7000x7000 here), so 64 bounds the decode at
# a few hundred milliseconds while no real encoder comes near it.
DEFAULT_MAX_JPEG_SCANS = 64

SUPPORTED_MEDIA_TYPES: tuple[str, ...] = ("image/png", "image/jpeg", "image/webp", "image/gif")

# Pillow format name -> media type, for the formats we accept.
_FORMAT_MEDIA_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}

# `data:[<media type>][;param=value]*;base64,<payload>` — media type and params are short tokens.
_TOKEN = r"[A-Za-z0-9!#$&^_.+-]+"
_DATA_URL = re.compile(rf"data:({_TOKEN}/{_TOKEN})?((?:;[A-Za-z0-9=._+-]{{1,64}}){{0,8}}),")
_BASE64_CHARS = re.compile(rb"[A-Za-z0-9+/]*={0,2}")


class ImageError(ValueError):
    """Raised for bytes that are not an acceptable image.

    `reason` is short and safe to show a client: it never contains the bytes,
    the base64 text or a library's exception text.
    """

    def __init__(self, reason: str, *, code: str = "invalid_image") -> None:
        super().__init__(reason)
        self.reason = reason
        self.code = code


@dataclass(frozen=True, slots=True)
class ImageLimits:
    """Bounds applied before an image is decoded."""

    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    # 50 Mpx: generous for screenshots, far below decompression-bomb sizes.
    max_pixels: int = 50_000_000
    min_side: int = 1
    # Start-of-scan segments in one JPEG (see DEFAULT_MAX_JPEG_SCANS).
    max_jpeg_scans: int = DEFAULT_MAX_JPEG_SCANS


@dataclass(frozen=True, slots=True)
class ImageInfo:
    media_type: str
    width: int
    height: int


def sniff_media_type(data: bytes) -> str | None:
    """The media type that the bytes' signature says, if it is one we accept."""
    if data.startswith(b"\x89PNG\r\n\x1a\n"):
        return "image/png"
    if data.startswith(b"\xff\xd8\xff"):
        return "image/jpeg"
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP":
        return "image/webp"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    return None


def parse_data_url(url: str, *, max_bytes: int = DEFAULT_MAX_IMAGE_BYTES) -> tuple[str | None, bytes]:
    """Split a base64 `data:` URL into (declared media type or None, decoded bytes).

    Raises ImageError for anything that is not a well-formed base64 data URL or
    whose payload would decode to more than `max_bytes`.
    """
    if not url.startswith("data:"):
        raise ImageError("expected a data: URL", code="invalid_image_url")
    match = _DATA_URL.match(url)
    if match is None:
        raise ImageError("malformed data: URL", code="invalid_image_url")
    params = [p.lower() for p in match.group(2).split(";") if p]
    if "base64" not in params:
        raise ImageError("data: URL images must be base64-encoded", code="invalid_image_url")
    payload = url[match.end() :]
    # Bound before decoding: base64 expands 3 bytes into 4 characters.
    if len(payload) > (max_bytes + 2) // 3 * 4 + 4:
        raise ImageError(f"image is larger than {max_bytes} bytes", code="image_too_large")
    raw = payload.encode("ascii", errors="replace").replace(b"\n", b"").replace(b"\r", b"")
    if _BASE64_CHARS.fullmatch(raw) is None or len(raw) % 4 == 1:
        raise ImageError("invalid base64 in data: URL", code="invalid_base64")
    try:
        data = base64.b64decode(raw + b"=" * (-len(raw) % 4), validate=True)
    except (binascii.Error, ValueError):
        raise ImageError("invalid base64 in data: URL", code="invalid_base64") from None
    if not data:
        raise ImageError("empty image in data: URL", code="invalid_image")
    declared = match.group(1).lower() if match.group(1) else None
    return declared, data


def inspect_image(
    data: bytes, *, declared_media_type: str | None = None, limits: ImageLimits = ImageLimits()
) -> ImageInfo:
    """Check bytes without decoding the pixels: format, declared type, size bounds.

    Pillow reads only the header here, so a decompression bomb is refused
    before it costs any memory.
    """
    if len(data) > limits.max_bytes:
        raise ImageError(f"image is larger than {limits.max_bytes} bytes", code="image_too_large")
    media_type = sniff_media_type(data)
    if media_type is None:
        raise ImageError(
            "unsupported or unrecognised image format (accepted: png, jpeg, webp, gif)",
            code="unsupported_image_format",
        )
    if declared_media_type is not None:
        declared = declared_media_type.lower()
        if declared == "image/jpg":
            declared = "image/jpeg"
        if declared != media_type:
            raise ImageError(
                f"declared media type {declared_media_type!r} does not match the image bytes ({media_type})",
                code="invalid_image",
            )
    width, height = header_size(data)
    if width < limits.min_side or height < limits.min_side:
        raise ImageError("image has no pixels", code="invalid_image")
    if width * height > limits.max_pixels:
        raise ImageError(
            f"image has {width}x{height} pixels, over the limit of {limits.max_pixels}",
            code="image_too_large",
        )
    if media_type == "image/jpeg":
        scans = jpeg_scan_count(data)
        if scans > limits.max_jpeg_scans:
            raise ImageError(
                f"JPEG has more than {limits.max_jpeg_scans} scans (the limit); "
                "re-encode it as a baseline or ordinary progressive JPEG",
                code="image_too_complex",
            )
    return ImageInfo(media_type=media_type, width=width, height=height)


def decode_image(
    data: bytes,
    *,
    declared_media_type: str | None = None,
    limits: ImageLimits = ImageLimits(),
    min_size: tuple[int, int] | None = None,
) -> Image.Image:
    """Decode checked bytes into an RGB image, EXIF orientation applied, first frame only.

    `min_size` (width, height as stored, before EXIF rotation): the smallest size the caller
    needs. A bigger image is decoded at a reduced scale (JPEG DCT scaling) and reduced by a
    whole factor right after decoding, never below `min_size`; the full-size pixels are
    dropped at once. Without it the image keeps its size.
    """
    inspect_image(data, declared_media_type=declared_media_type, limits=limits)
    try:
        opened = Image.open(io.BytesIO(data))
        opened.seek(0)  # animated GIF/WebP: the first frame
        if min_size is not None and opened.format == "JPEG":
            # Decodes at 1/2, 1/4 or 1/8 scale while staying at least min_size.
            opened.draft("RGB", min_size)
        opened.load()
        image: Image.Image = opened
        if min_size is not None:
            factor = min(image.width // max(1, min_size[0]), image.height // max(1, min_size[1]))
            if factor >= 2:
                if image.mode not in _REDUCIBLE_MODES:  # palette, 1-bit, 16-bit: convert first
                    image = _to_rgb(image)
                image = image.reduce(factor)
                opened.close()  # the full-size pixels go now, not when the caller is done
        return _to_rgb(ImageOps.exif_transpose(image) or image)
    except (OSError, ValueError, SyntaxError, EOFError, Image.DecompressionBombError, UnidentifiedImageError):
        raise ImageError("image bytes could not be decoded", code="invalid_image") from None


# Modes Image.reduce works on directly.
_REDUCIBLE_MODES = frozenset({"L", "LA", "RGB", "RGBA", "CMYK", "I", "F"})

# A marker: 0xFF (fill bytes allowed) then a code that is not a stuffed zero, a restart marker
# (RSTn, inside entropy-coded data) or another fill byte.
_JPEG_MARKER = re.compile(rb"\xff+([^\x00\xd0-\xd7\xff])")
_JPEG_STANDALONE = frozenset({0x01, *range(0xD0, 0xD8)})


def jpeg_scan_count(data: bytes) -> int:
    """How many start-of-scan (SOS) markers a JPEG has, without decoding it.

    The segments before the first scan are walked by their lengths, so an EXIF thumbnail's own
    scans (inside APP1) do not count. From the first scan to the end of the data the pairs
    0xFF 0xDA are counted (at C speed: 20 MB in a few milliseconds): entropy-coded data never
    holds one (an 0xFF there is followed by 0x00 or a restart marker), so each is a scan, or a
    byte pair inside a table or comment between scans or in data after the image (a phone's
    second picture), which errs only toward refusing.
    Malformed structure ends the walk; decoding reports it.
    """
    position = 2  # after SOI
    while position + 4 <= len(data):
        match = _JPEG_MARKER.match(data, position)
        if match is None:
            return 0
        marker = match.group(1)[0]
        if marker == 0xDA:  # the first scan; counted to the end of the data, not to an EOI,
            # which a comment segment could spell to hide the scans after it
            return data.count(b"\xff\xda", match.start())
        position = match.end()
        if marker == 0xD9:
            return 0
        if marker not in _JPEG_STANDALONE:
            position += int.from_bytes(data[position : position + 2], "big")
    return 0


def header_size(data: bytes) -> tuple[int, int]:
    """(width, height) from an image's header, nothing decoded; ImageError when unreadable."""
    try:
        with Image.open(io.BytesIO(data)) as probe:
            if probe.format not in _FORMAT_MEDIA_TYPES:
                raise ImageError("unsupported image format", code="unsupported_image_format")
            return probe.size
    except ImageError:
        raise
    except Image.DecompressionBombError:
        # Pillow refuses sizes far over its own limit while reading the header.
        raise ImageError("image has too many pixels", code="image_too_large") from None
    except (OSError, ValueError, SyntaxError, EOFError, UnidentifiedImageError):
        raise ImageError("image bytes could not be decoded", code="invalid_image") from None


def _to_rgb(image: Image.Image) -> Image.Image:
    if image.mode == "RGB":
        return image
    if image.mode in ("RGBA", "LA", "PA") or (image.mode == "P" and "transparency" in image.info):
        # Composite onto white, as a viewer would show it, rather than on black.
        rgba = image.convert("RGBA")
        background = Image.new("RGB", rgba.size, (255, 255, 255))
        background.paste(rgba, mask=rgba.getchannel("A"))
        return background
    if image.mode in ("I;16", "I;16B", "I;16L", "I"):
        # 16-bit greyscale: scale to 8 bits instead of clipping.
        return image.convert("I").point(lambda v: v * (1 / 256)).convert("L").convert("RGB")
    return image.convert("RGB")
