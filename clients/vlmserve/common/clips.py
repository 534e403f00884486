"""Video and audio bytes: which container they are, from their first bytes only. The one rule of
which clips are accepted, for the facade (before it sends anything on) and the engine (before a
demuxer sees the bytes, `vlmserve.engine.media`).

A format is accepted where the engine's decoders decode it (tests/common/test_clips.py holds
each format against them): FFmpeg through OpenCV for video (MP4 and its kin MOV, M4V, 3GP;
WebM and Matroska; AVI; an animated GIF sent as a clip), miniaudio for audio (WAV, MP3, FLAC,
Ogg Vorbis). Bytes these decoders cannot read are refused here, where the refusal can say what
is accepted, not after a worker process failed on them: MPEG-4 audio (M4A: AAC, which no decoder
here reads, and no video stream), HEIF and AVIF stills (an `ftyp` box, but no clip), Ogg Opus and
other Ogg codecs (miniaudio reads Vorbis only). The sniff also keeps FFmpeg's other demuxers
(playlists that open files and URLs, image sequences) away from a client's bytes.

A declared type (a data: URL's, OpenAI's audio `format`, a contract part's `media_type`) must
name the format the bytes are: one file, one kind, whatever the client called it.
"""

from __future__ import annotations

from typing import Literal

__all__ = [
    "AUDIO_FORMATS",
    "CLIP_FORMATS",
    "DEFAULT_MAX_CLIP_BYTES",
    "KIND_FORMATS",
    "ClipKind",
    "clip_format",
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

# Each accepted format -> the media types that name it, the canonical one first. The engine's
# decoders are chosen by the format (`mp3` -> miniaudio's MP3 decoder).
CLIP_FORMATS: dict[str, tuple[str, ...]] = {
    "mp4": ("video/mp4", "video/quicktime", "video/x-m4v", "video/3gpp"),  # ISO BMFF: an ftyp box
    "webm": ("video/webm", "video/x-matroska", "video/mkv"),  # EBML (WebM, Matroska)
    "avi": ("video/x-msvideo", "video/avi", "video/msvideo"),  # RIFF AVI
    "gif": ("image/gif",),  # an animated GIF sent as a clip
    "wav": ("audio/wav", "audio/x-wav", "audio/wave", "audio/vnd.wave"),
    "mp3": ("audio/mpeg", "audio/mp3", "audio/mpeg3", "audio/x-mp3"),
    "flac": ("audio/flac", "audio/x-flac"),
    "ogg": ("audio/ogg", "audio/vorbis", "application/ogg"),  # Ogg Vorbis
}
# Which formats a video part and an audio part take.
KIND_FORMATS: dict[ClipKind, tuple[str, ...]] = {
    "video": ("mp4", "webm", "avi", "gif"),
    "audio": ("wav", "mp3", "flac", "ogg"),
}
_FORMAT_OF = {media_type: name for name, types in CLIP_FORMATS.items() for media_type in types}

# ISO BMFF major brands that are no video: MPEG-4 audio (AAC), HEIF and AVIF stills.
_NOT_VIDEO_BRANDS = frozenset(
    {b"M4A ", b"M4B ", b"M4P ", b"F4A ", b"F4B ", b"heic", b"heix", b"mif1", b"msf1", b"avif"}
)
# An Ogg stream's first page: 27 bytes of header, its segment table, then the codec's
# identification packet; miniaudio decodes Vorbis only.
_OGG_PAGE_HEADER = 27
_VORBIS_ID = b"\x01vorbis"


def clip_format(media_type: str) -> str | None:
    """The accepted format a media type names ("mp4" for `video/quicktime`; parameters and case
    ignored), else None."""
    return _FORMAT_OF.get(media_type.split(";", 1)[0].strip().lower())


def sniff_video(data: bytes) -> str | None:
    """The video container the bytes start with (MP4/MOV, WebM/Matroska, AVI), else None. An
    animated GIF is an image here (uploads and image parts keep it one); a video part takes it
    as a clip (`sniff_video_part`)."""
    if data[4:8] == b"ftyp":
        brand = data[8:12]
        if len(brand) < 4 or brand in _NOT_VIDEO_BRANDS:
            return None  # MPEG-4 audio, a HEIF / AVIF still, or cut short
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


def _ogg_vorbis(data: bytes) -> bool:
    segments = data[_OGG_PAGE_HEADER - 1] if len(data) >= _OGG_PAGE_HEADER else 0
    start = _OGG_PAGE_HEADER + segments
    return segments > 0 and data[start : start + len(_VORBIS_ID)] == _VORBIS_ID


def sniff_audio(data: bytes) -> str | None:
    """The audio format the bytes start with (WAV, MP3, FLAC, Ogg Vorbis), else None."""
    if data[:4] == b"RIFF" and data[8:12] == b"WAVE":
        return "audio/wav"
    # An ID3 tag, or an MPEG audio frame sync (11 set bits, layer bits not 00: not AAC's ADTS).
    if data.startswith(b"ID3") or (
        len(data) > 1 and data[0] == 0xFF and data[1] & 0xE0 == 0xE0 and data[1] & 0x06
    ):
        return "audio/mpeg"
    if data.startswith(b"fLaC"):
        return "audio/flac"
    if data.startswith(b"OggS") and _ogg_vorbis(data):
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
    """Whether a declared media type names the format the bytes are (any of its names)."""
    found = clip_format(sniffed)
    return found is not None and clip_format(declared) == found
