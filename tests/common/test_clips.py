"""The one rule of accepted clip formats (vlmserve.common.clips), as tables of first bytes: every
format we take, its kin we refuse, garbage and headers cut short. The engine's decoders decoding
what this accepts (and failing on what it refuses) is tests/engine/test_media_formats.py."""

from __future__ import annotations

import pytest

from tests._clips import (
    AVIF_HEAD,
    FLAC_HEAD,
    MOV_HEAD,
    MP3_HEAD,
    MP4_HEAD,
    OGG_HEAD,
    WEBM_HEAD,
    gif_bytes,
    wav_bytes,
)
from vlmserve.common.clips import (
    AUDIO_FORMATS,
    CLIP_FORMATS,
    KIND_FORMATS,
    clip_format,
    same_container,
    sniff_audio,
    sniff_clip,
    sniff_video,
    sniff_video_part,
)


def ftyp(brand: bytes) -> bytes:
    return b"\x00\x00\x00\x18ftyp" + brand + b"\x00\x00\x02\x00" + brand + b"isom" + b"\x00\x00\x00\x08mdat"


def ogg_first_page(packet: bytes) -> bytes:
    return b"OggS\x00\x02" + bytes(20) + b"\x01" + bytes([len(packet)]) + packet


MKV_HEAD = b"\x1a\x45\xdf\xa3\xa3\x42\x86\x81\x01\x42\xf7\x81\x01\x42\x82\x88matroska\x42\x87\x81\x04"
AVI_HEAD = b"RIFF\x00\x10\x00\x00AVI LIST\x00\x00\x00\x00hdrlavih"
WAV = wav_bytes()
MP3_SYNC = b"\xff\xfb\x90\x64" + bytes(32)  # MPEG-1 layer III, no ID3 tag
MP3_MPEG2 = b"\xff\xf3\x88\xc4" + bytes(32)  # MPEG-2 layer III (what LAME writes at 16 kHz)
MP2_SYNC = b"\xff\xf5\xe8\xc4" + bytes(32)  # MPEG-2 layer II: miniaudio's MP3 decoder reads it
ADTS_AAC = b"\xff\xf1\x60\x40\x3f\xbf\xfc" + bytes(32)  # AAC's own frame sync: layer bits 00
VORBIS_OGG = ogg_first_page(b"\x01vorbis" + bytes(23))
OPUS_OGG = ogg_first_page(b"OpusHead\x01\x01\x38\x01\x80\x3e\x00\x00\x00\x00\x00")
FLAC_OGG = ogg_first_page(b"\x7fFLAC\x01\x00\x00\x01fLaC" + bytes(20))
SPEEX_OGG = ogg_first_page(b"Speex   1.2" + bytes(40))
PNG = b"\x89PNG\r\n\x1a\n" + bytes(24)
GIF = gif_bytes()

# (case, bytes, sniff_clip's answer, sniff_video_part's answer)
CASES: list[tuple[str, bytes, tuple[str, str] | None, str | None]] = [
    ("mp4 (isom)", MP4_HEAD, ("video", "video/mp4"), "video/mp4"),
    ("mp4 (mp42)", ftyp(b"mp42"), ("video", "video/mp4"), "video/mp4"),
    ("mov", MOV_HEAD, ("video", "video/quicktime"), "video/quicktime"),
    ("m4v", ftyp(b"M4V "), ("video", "video/mp4"), "video/mp4"),
    ("3gp", ftyp(b"3gp4"), ("video", "video/mp4"), "video/mp4"),
    ("webm", WEBM_HEAD, ("video", "video/webm"), "video/webm"),
    ("mkv", MKV_HEAD, ("video", "video/x-matroska"), "video/x-matroska"),
    ("avi", AVI_HEAD, ("video", "video/x-msvideo"), "video/x-msvideo"),
    # An animated GIF is an image file; a video part takes it as a clip.
    ("gif", GIF, None, "image/gif"),
    ("gif87a", b"GIF87a" + bytes(20), None, "image/gif"),
    ("wav", WAV, ("audio", "audio/wav"), None),
    ("mp3 (ID3)", MP3_HEAD, ("audio", "audio/mpeg"), None),
    ("mp3 (frame sync)", MP3_SYNC, ("audio", "audio/mpeg"), None),
    ("mp3 (MPEG-2)", MP3_MPEG2, ("audio", "audio/mpeg"), None),
    ("mp2", MP2_SYNC, ("audio", "audio/mpeg"), None),
    ("flac", FLAC_HEAD, ("audio", "audio/flac"), None),
    ("ogg vorbis", OGG_HEAD, ("audio", "audio/ogg"), None),
    ("ogg vorbis (built)", VORBIS_OGG, ("audio", "audio/ogg"), None),
    # Refused: what the engine's decoders cannot decode.
    ("m4a", ftyp(b"M4A "), None, None),  # AAC, and no video stream
    ("m4b", ftyp(b"M4B "), None, None),
    ("m4p", ftyp(b"M4P "), None, None),
    ("f4a", ftyp(b"F4A "), None, None),
    ("heic", ftyp(b"heic"), None, None),
    ("heif", ftyp(b"mif1"), None, None),
    ("heif sequence", ftyp(b"msf1"), None, None),
    ("avif", AVIF_HEAD, None, None),
    ("aac (adts)", ADTS_AAC, None, None),
    ("ogg opus", OPUS_OGG, None, None),
    ("ogg flac", FLAC_OGG, None, None),
    ("ogg speex", SPEEX_OGG, None, None),
    # Not clips at all.
    ("png", PNG, None, None),
    ("hls playlist", b"#EXTM3U\n#EXT-X-VERSION:3\n", None, None),  # opens files and URLs
    ("riff, neither wave nor avi", b"RIFF\x00\x00\x00\x00WEBPVP8 ", None, None),
    ("garbage", b"\xff\x00garbage" + bytes(20), None, None),
    ("text", b"hello, this is not a clip at all", None, None),
    ("empty", b"", None, None),
    # Headers cut short: a signature that could not be read whole is no clip.
    ("mp4 cut in its brand", MP4_HEAD[:10], None, None),
    ("mp4 cut before ftyp", MP4_HEAD[:6], None, None),
    ("ebml cut", WEBM_HEAD[:3], None, None),
    ("riff cut", b"RIFF\x00\x00", None, None),
    ("wav cut before WAVE", WAV[:9], None, None),
    ("avi cut before AVI", AVI_HEAD[:10], None, None),
    ("ogg page header only", b"OggS\x00\x02" + bytes(20), None, None),
    ("ogg cut in its codec id", VORBIS_OGG[:31], None, None),
    ("flac cut", b"fLa", None, None),
    ("gif cut", b"GIF8", None, None),
    ("one sync byte", b"\xff", None, None),
]


@pytest.mark.parametrize(("data", "clip", "video_part"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_formats_from_first_bytes(data: bytes, clip: tuple[str, str] | None, video_part: str | None) -> None:
    assert sniff_clip(data) == clip
    assert sniff_video_part(data) == video_part
    assert sniff_video(data) == (clip[1] if clip and clip[0] == "video" else None)
    assert sniff_audio(data) == (clip[1] if clip and clip[0] == "audio" else None)


@pytest.mark.parametrize(
    ("declared", "sniffed", "same"),
    [
        ("video/mp4", "video/mp4", True),
        ("video/quicktime", "video/mp4", True),  # one container, several names
        ("video/mp4", "video/quicktime", True),
        ("video/3gpp", "video/mp4", True),
        ("video/x-matroska", "video/webm", True),
        ("video/mkv", "video/x-matroska", True),
        ("video/avi", "video/x-msvideo", True),
        ("Video/MP4", "video/mp4", True),
        ("video/webm", "video/mp4", False),
        ("video/mp4", "image/gif", False),
        ("image/gif", "image/gif", True),
        ("audio/x-wav", "audio/wav", True),
        ("audio/mp3", "audio/mpeg", True),
        ("application/ogg", "audio/ogg", True),
        ("audio/vorbis", "audio/ogg", True),
        ("audio/opus", "audio/ogg", False),  # Opus is not what the engine decodes
        ("audio/mpeg", "audio/wav", False),
        ("video/unknown", "video/unknown", False),  # no accepted format, named the same or not
        ("", "video/mp4", False),
    ],
)
def test_same_container(declared: str, sniffed: str, same: bool) -> None:
    assert same_container(declared, sniffed) is same


def test_every_name_is_of_one_format_and_every_format_of_one_kind() -> None:
    names = [name for types in CLIP_FORMATS.values() for name in types]
    assert len(names) == len(set(names))
    assert sorted(KIND_FORMATS["video"] + KIND_FORMATS["audio"]) == sorted(CLIP_FORMATS)
    assert {clip_format(media_type) for media_type in AUDIO_FORMATS.values()} == set(KIND_FORMATS["audio"])
    assert clip_format("Video/QuickTime; codecs=avc1") == "mp4"
    assert clip_format("audio/aac") is None


def test_what_the_sniffs_answer_is_an_accepted_format_of_its_kind() -> None:
    for _, _data, clip, video_part in CASES:
        if clip is not None:
            assert clip_format(clip[1]) in KIND_FORMATS[clip[0]]  # type: ignore[index]
        if video_part is not None:
            assert clip_format(video_part) in KIND_FORMATS["video"]
