"""What container or audio file a clip's bytes are, from their signature (pure).

A client's media type is a label; the bytes decide. A label that names another format is refused
(a mismatch is a client bug worth reporting, as for images), an empty label takes what the bytes
say, and bytes of no format we accept are refused before any demuxer sees them: the sniff is also
what keeps FFmpeg's other demuxers (playlists that open files and URLs, image sequences) away
from client bytes.
"""

from __future__ import annotations

from vlmserve.engine.media.limits import MediaError

__all__ = ["AUDIO_FORMATS", "VIDEO_FORMATS", "sniff_audio", "sniff_video"]

# Format -> the media types that name it (the first is the canonical one).
VIDEO_FORMATS: dict[str, tuple[str, ...]] = {
    "mp4": ("video/mp4", "video/quicktime", "video/x-m4v", "video/3gpp"),  # ISO BMFF: ftyp box
    "webm": ("video/webm", "video/x-matroska", "video/mkv"),  # EBML (Matroska, WebM)
    "avi": ("video/x-msvideo", "video/avi", "video/msvideo"),  # RIFF AVI
    "gif": ("image/gif",),  # an animated GIF sent as a clip
}
# ISO BMFF brands of still images (HEIF, AVIF): an ftyp box, but no clip.
_STILL_BRANDS = frozenset({b"heic", b"heix", b"mif1", b"avif"})
AUDIO_FORMATS: dict[str, tuple[str, ...]] = {
    "wav": ("audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave"),
    "mp3": ("audio/mpeg", "audio/mp3", "audio/mpeg3", "audio/x-mp3"),
    "flac": ("audio/flac", "audio/x-flac"),
    "ogg": ("audio/ogg", "audio/vorbis", "application/ogg"),
}


def _video_format(data: bytes) -> str | None:
    if data[4:8] == b"ftyp":
        return None if data[8:12] in _STILL_BRANDS else "mp4"
    if data[:4] == b"\x1a\x45\xdf\xa3":
        return "webm"
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "avi"
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "gif"
    return None


def _audio_format(data: bytes) -> str | None:
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "wav"
    if data[:4] == b"fLaC":
        return "flac"
    if data[:4] == b"OggS":
        return "ogg"
    # An ID3 tag, or an MPEG audio frame sync (11 set bits, layer bits not 00).
    if data[:3] == b"ID3" or (
        len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0 and data[1] & 0x06
    ):
        return "mp3"
    return None


def _check(
    found: str | None, declared: str, formats: dict[str, tuple[str, ...]], kind: str, field: str
) -> str:
    accepted = ", ".join(types[0] for types in formats.values())
    if found is None:
        raise MediaError(
            f"unsupported or unrecognised {kind} format (accepted: {accepted})",
            code="media_type",
            field=f"{field}.data",
        )
    label = declared.strip().lower().split(";", 1)[0].strip()
    if label and label not in formats[found]:
        raise MediaError(
            f"declared media type {declared!r} does not match the {kind} bytes ({formats[found][0]})",
            code="media_type",
            field=f"{field}.media_type",
        )
    return found


def sniff_video(data: bytes, declared: str) -> str:
    """The container format ("mp4", "webm", "avi") of `data`, checked against `declared`."""
    return _check(_video_format(data), declared, VIDEO_FORMATS, "video", "video")


def sniff_audio(data: bytes, declared: str) -> str:
    """The audio format ("wav", "mp3", "flac", "ogg") of `data`, checked against `declared`."""
    return _check(_audio_format(data), declared, AUDIO_FORMATS, "audio", "audio")
