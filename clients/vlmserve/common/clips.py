"""Video and audio bytes: which container they are, from their first bytes only.

The facade never decodes a clip (the engine probes and decodes it, bounded:
the engine's `media/` package); it only has to know, before it sends anything on, that a video part
holds a video container and an audio part an audio file, and which media type to send with it.
A declared type (a data: URL's, OpenAI's audio `format`) must agree with what the bytes say:
one file, one kind, whatever the client called it.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "AUDIO_FORMATS",
    "DEFAULT_MAX_CLIP_BYTES",
    "ClipKind",
    "same_container",
    "sniff_audio",
    "sniff_clip",
    "sniff_video",
    "sniff_video_part",
]

ClipKind = Literal["video", "audio"]
# Per clip, as docs/video-audio.md says (the engine bounds duration and frames from the header).
DEFAULT_MAX_CLIP_BYTES = 64 * 1024 * 1024

# OpenAI's `input_audio.format` -> the media type the engine decodes (docs/video-audio.md).
AUDIO_FORMATS: dict[str, str] = {
    "wav": "audio/wav",
    "mp3": "audio/mpeg",
    "flac": "audio/flac",
    "ogg": "audio/ogg",
}

# ISO BMFF brands that are no video: MPEG-4 audio, HEIF and AVIF stills (as the engine's sniff).
_NOT_VIDEO_BRANDS = frozenset({b"M4A ", b"M4B ", b"M4P ", b"heic", b"heix", b"mif1", b"avif"})

# Names of one container that clients spell several ways: compared as their canonical type (the
# engine's sniff accepts the same names).
_ALIASES = {
    "video/quicktime": "video/mp4",
    "video/x-m4v": "video/mp4",
    "video/3gpp": "video/mp4",
    "video/x-matroska": "video/webm",
    "video/mkv": "video/webm",
    "video/avi": "video/x-msvideo",
    "video/msvideo": "video/x-msvideo",
    "audio/x-wav": "audio/wav",
    "audio/wave": "audio/wav",
    "audio/vnd.wave": "audio/wav",
    "audio/mp3": "audio/mpeg",
    "audio/mpeg3": "audio/mpeg",
    "audio/x-mp3": "audio/mpeg",
    "application/ogg": "audio/ogg",
    "audio/x-flac": "audio/flac",
    "audio/opus": "audio/ogg",
    "audio/vorbis": "audio/ogg",
}


def sniff_video(data: bytes) -> str | None:
    """The video container the bytes start with (MP4/MOV, WebM/Matroska, AVI), else None. An
    animated GIF is an image here (uploads and image parts keep it one); a video part takes it
    as a clip (`sniff_video_part`)."""
    if data[4:8] == b"ftyp":
        brand = data[8:12]
        if brand in _NOT_VIDEO_BRANDS:
            return None  # MPEG-4 audio, or a HEIF / AVIF still
        return "video/quicktime" if brand == b"qt  " else "video/mp4"
    if data.startswith(b"\x1a\x45\xdf\xa3"):
        # EBML: the DocType in the header says WebM or Matroska.
        return "video/webm" if b"webm" in data[:64] else "video/x-matroska"
    if data[:4] == b"RIFF" and data[8:12] == b"AVI ":
        return "video/x-msvideo"
    return None


def sniff_video_part(data: bytes) -> str | None:
    """What a video part's bytes are: a video container, or an animated GIF sent as a clip (the
    engine decodes both; docs/video-audio.md)."""
    if data[:6] in (b"GIF87a", b"GIF89a"):
        return "image/gif"
    return sniff_video(data)


def sniff_audio(data: bytes) -> str | None:
    """The audio format the bytes start with (WAV, MP3, FLAC, Ogg), else None."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "audio/wav"
    # An ID3 tag, or an MPEG audio frame sync (11 set bits, layer bits not 00), as the engine reads it.
    if data.startswith(b"ID3") or (
        len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0 and data[1] & 0x06
    ):
        return "audio/mpeg"
    if data.startswith(b"fLaC"):
        return "audio/flac"
    if data.startswith(b"OggS"):
        return "audio/ogg"
    return None


def sniff_clip(data: bytes) -> tuple[ClipKind, str] | None:
    """(kind, media type) of video or audio bytes; None for anything else."""
    video = sniff_video(data)
    if video is not None:
        return "video", video
    audio = sniff_audio(data)
    return ("audio", audio) if audio is not None else None


def same_container(declared: str, sniffed: str) -> bool:
    """Whether a declared media type names the container the bytes are (aliases allowed)."""
    declared = declared.lower()
    return _ALIASES.get(declared, declared) == _ALIASES.get(sniffed, sniffed)
