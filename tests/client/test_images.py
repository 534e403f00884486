"""vlmserve.common.images: the one place untrusted image bytes are checked."""

from __future__ import annotations

import base64
import io

import pytest
from PIL import Image

from vlmserve.common.images import (
    ImageError,
    ImageLimits,
    decode_image,
    inspect_image,
    parse_data_url,
    sniff_media_type,
)


def encode(mode: str = "RGB", size: tuple[int, int] = (8, 6), fmt: str = "PNG", **save: object) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, color=None if mode in ("P", "1") else 0).save(buffer, fmt, **save)
    return buffer.getvalue()


def data_url(data: bytes, media_type: str = "image/png") -> str:
    return f"data:{media_type};base64,{base64.b64encode(data).decode()}"


@pytest.mark.parametrize(
    ("fmt", "media_type"),
    [("PNG", "image/png"), ("JPEG", "image/jpeg"), ("WEBP", "image/webp"), ("GIF", "image/gif")],
)
def test_sniff_recognises_accepted_formats(fmt: str, media_type: str) -> None:
    assert sniff_media_type(encode(fmt=fmt)) == media_type


@pytest.mark.parametrize("data", [b"", b"hello", b"%PDF-1.7", encode(fmt="BMP"), encode(fmt="TIFF")])
def test_sniff_refuses_everything_else(data: bytes) -> None:
    assert sniff_media_type(data) is None


def test_data_url_round_trip() -> None:
    raw = encode()
    assert parse_data_url(data_url(raw)) == ("image/png", raw)


def test_data_url_without_media_type_is_accepted_and_sniffed_later() -> None:
    raw = encode()
    declared, data = parse_data_url("data:;base64," + base64.b64encode(raw).decode())
    assert declared is None and data == raw


@pytest.mark.parametrize(
    ("url", "code"),
    [
        ("http://example.com/a.png", "invalid_image_url"),
        ("data:image/png,rawtext", "invalid_image_url"),
        ("data:image/png;base64,!!!!", "invalid_base64"),
        ("data:image/png;base64,QUJDR", "invalid_base64"),
        ("data:image/png;base64,", "invalid_image"),
        ("data:image png;base64,QUJD", "invalid_image_url"),
    ],
)
def test_bad_data_urls_are_refused_with_a_code(url: str, code: str) -> None:
    with pytest.raises(ImageError) as caught:
        parse_data_url(url)
    assert caught.value.code == code


def test_oversized_payload_is_refused_before_decoding() -> None:
    url = "data:image/png;base64," + "A" * 4000
    with pytest.raises(ImageError) as caught:
        parse_data_url(url, max_bytes=1000)
    assert caught.value.code == "image_too_large"


def test_error_reason_never_echoes_the_payload() -> None:
    secret = base64.b64encode(b"secret-bytes-here" * 4).decode()
    with pytest.raises(ImageError) as caught:
        inspect_image(base64.b64decode(secret))
    assert secret not in caught.value.reason and "secret" not in caught.value.reason


def test_declared_type_must_match_bytes() -> None:
    with pytest.raises(ImageError, match="does not match"):
        inspect_image(encode(fmt="PNG"), declared_media_type="image/jpeg")
    assert inspect_image(encode(fmt="JPEG"), declared_media_type="image/jpg").media_type == "image/jpeg"


def test_pixel_bomb_is_refused_from_the_header() -> None:
    # 20 000 x 20 000 one-bit PNG: ~50 KB on disk, 400 Mpx decoded.
    bomb = encode(mode="1", size=(20_000, 20_000))
    assert len(bomb) < 200_000
    with pytest.raises(ImageError) as caught:
        inspect_image(bomb)
    assert caught.value.code == "image_too_large"


def test_pixel_limit_is_a_setting() -> None:
    with pytest.raises(ImageError, match="over the limit"):
        inspect_image(encode(size=(100, 100)), limits=ImageLimits(max_pixels=9_999))
    assert inspect_image(encode(size=(100, 100)), limits=ImageLimits(max_pixels=10_000)).width == 100


def test_truncated_image_is_refused_on_decode() -> None:
    with pytest.raises(ImageError):
        decode_image(encode(size=(64, 64))[:60])


@pytest.mark.parametrize("mode", ["RGB", "RGBA", "L", "LA", "P", "I;16", "1"])
def test_decode_gives_rgb_of_the_same_size(mode: str) -> None:
    image = decode_image(encode(mode=mode, size=(9, 7)))
    assert image.mode == "RGB" and image.size == (9, 7)


def test_cmyk_jpeg_decodes_to_rgb() -> None:
    assert decode_image(encode(mode="CMYK", fmt="JPEG")).mode == "RGB"


def test_transparent_pixels_composite_on_white() -> None:
    buffer = io.BytesIO()
    Image.new("RGBA", (2, 2), (0, 0, 0, 0)).save(buffer, "PNG")
    assert decode_image(buffer.getvalue()).getpixel((0, 0)) == (255, 255, 255)


def test_exif_rotation_is_applied() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6  # rotate 90° clockwise on display
    buffer = io.BytesIO()
    Image.new("RGB", (40, 20)).save(buffer, "JPEG", exif=exif)
    assert decode_image(buffer.getvalue()).size == (20, 40)


def test_animated_gif_gives_its_first_frame() -> None:
    frames = [Image.new("RGB", (4, 4), colour) for colour in ((255, 0, 0), (0, 0, 255))]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:])
    red, _green, blue = decode_image(buffer.getvalue()).getpixel((0, 0))  # type: ignore[misc]
    assert red > 200 and blue < 50
