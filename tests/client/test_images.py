"""vlmserve.common.images: the one place untrusted image bytes are checked."""

from __future__ import annotations

import base64
import io
import time

import pytest
from PIL import Image

from tests._data_urls import data_url
from tests.hardening import _image_corpus as corpus
from vlmserve.common.images import (
    DEFAULT_MAX_JPEG_SCANS,
    ImageError,
    ImageLimits,
    decode_image,
    inspect_image,
    jpeg_scan_count,
    parse_data_url,
    sniff_media_type,
)


def encode(mode: str = "RGB", size: tuple[int, int] = (8, 6), fmt: str = "PNG", **save: object) -> bytes:
    buffer = io.BytesIO()
    Image.new(mode, size, color=None if mode in ("P", "1") else 0).save(buffer, fmt, **save)
    return buffer.getvalue()


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


# -- progressive-JPEG scan bombs (docs/hardening.md, "Image bombs and formats") -----------------


def test_jpeg_scans_are_counted_without_decoding() -> None:
    assert jpeg_scan_count(encode(fmt="JPEG", size=(64, 64))) == 1
    assert jpeg_scan_count(encode(fmt="JPEG", size=(64, 64), progressive=True)) == 10
    assert jpeg_scan_count(corpus.jpeg_scan_bomb(scans=2000)) == 2010


def test_scans_of_an_exif_thumbnail_do_not_count() -> None:
    thumbnail = encode(fmt="JPEG", size=(16, 16), progressive=True)  # 10 scans of its own
    exif = Image.Exif()
    exif[0x0201] = 0  # JPEGInterchangeFormat: a thumbnail lives in the APP1 payload
    payload = b"Exif\x00\x00" + thumbnail * 10
    image = encode(fmt="JPEG", size=(32, 32))
    app1 = b"\xff\xe1" + (len(payload) + 2).to_bytes(2, "big") + payload
    with_thumbnails = image[:2] + app1 + image[2:]
    assert jpeg_scan_count(with_thumbnails) == 1
    assert inspect_image(with_thumbnails).width == 32


def test_scan_bomb_is_refused_before_decoding() -> None:
    # 7000 x 7000 is under the pixel limit; its 2,010 scans would take ~10 s to decode.
    bomb = corpus.jpeg_scan_bomb(scans=2000)
    assert len(bomb) < 100_000 and inspect_image(bomb, limits=ImageLimits(max_jpeg_scans=2010)).width == 7000
    started = time.process_time()
    for check in (inspect_image, decode_image):
        with pytest.raises(ImageError) as caught:
            check(bomb)
        assert caught.value.code == "image_too_complex"
        assert f"more than {DEFAULT_MAX_JPEG_SCANS} scans" in caught.value.reason
    # Far below one decode pass over 7000 x 7000 (~0.1 s of CPU), let alone 2,010 of them.
    assert time.process_time() - started < 0.5


def test_scan_limit_is_a_setting() -> None:
    bomb = corpus.jpeg_scan_bomb(width=64, height=64, scans=20)  # 30 scans
    assert decode_image(bomb).size == (64, 64)
    with pytest.raises(ImageError, match="more than 29 scans"):
        inspect_image(bomb, limits=ImageLimits(max_jpeg_scans=29))


# -- decoding big images small (docs/images.md, "Memory") ---------------------------------------


@pytest.mark.parametrize("fmt", ["JPEG", "PNG", "WEBP", "GIF"])
def test_big_images_decode_reduced_but_never_below_the_size_asked(fmt: str) -> None:
    data = encode(fmt=fmt, size=(2000, 1000))
    image = decode_image(data, min_size=(224, 112))
    # JPEG decodes at 1/8 scale (250 x 125); the others are reduced by a whole factor (8).
    assert image.mode == "RGB" and image.size == (250, 125)
    assert decode_image(data, min_size=(1000, 500)).size == (1000, 500)


def test_images_at_most_twice_the_size_asked_keep_their_size() -> None:
    data = encode(fmt="PNG", size=(447, 300))
    assert decode_image(data, min_size=(224, 150)).size == (447, 300)
    assert decode_image(data).size == (447, 300)


def test_reduction_keeps_exif_rotation() -> None:
    exif = Image.Exif()
    exif[0x0112] = 6
    buffer = io.BytesIO()
    Image.new("RGB", (800, 400)).save(buffer, "JPEG", exif=exif)
    assert decode_image(buffer.getvalue(), min_size=(100, 50)).size == (50, 100)


def test_an_end_of_image_spelled_in_a_comment_hides_no_scans() -> None:
    bomb = corpus.jpeg_scan_bomb(width=64, height=64, scans=100)
    between_scans = bomb.index(b"\xff\xc4", bomb.index(b"\xff\xda"))  # a table after the first scan
    comment = b"\xff\xfe\x00\x04\xff\xd9"  # a COM segment whose payload reads as EOI
    assert jpeg_scan_count(bomb[:between_scans] + comment + bomb[between_scans:]) >= 110
