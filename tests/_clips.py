"""Clip bytes as clients send them, for the translation and facade tests.

The facade only sniffs a clip's first bytes (the engine probes and decodes it), so the video
containers here are their leading header box only, named as such; the WAV is a real one (the
standard library writes it), for tests that send it anywhere that decodes.
"""

from __future__ import annotations

import base64
import io
import math
import wave

from PIL import Image

# An MP4's `ftyp` box and the start of its `mdat`: what the facade reads of an MP4.
MP4_HEAD = b"\x00\x00\x00\x18ftypisom\x00\x00\x02\x00isomiso2" + b"\x00\x00\x00\x08mdat"
# A QuickTime movie's `ftyp` (brand `qt  `).
MOV_HEAD = b"\x00\x00\x00\x14ftypqt  \x00\x00\x02\x00qt  " + b"\x00\x00\x00\x08mdat"
# WebM: the EBML header with DocType "webm".
WEBM_HEAD = b"\x1a\x45\xdf\xa3\x9f\x42\x86\x81\x01\x42\xf7\x81\x01\x42\x82\x84webm\x42\x87\x81\x04"
MP3_HEAD = b"ID3\x04\x00\x00\x00\x00\x00\x00" + b"\xff\xfb\x90\x64" + b"\x00" * 32
FLAC_HEAD = b"fLaC\x00\x00\x00\x22" + b"\x00" * 34
# An Ogg Vorbis stream's first page: its 27-byte header (one segment) and the start of the Vorbis
# identification packet (Ogg Opus and other Ogg codecs are refused: the engine decodes Vorbis).
OGG_HEAD = b"OggS\x00\x02" + b"\x00" * 20 + b"\x01\x1e" + b"\x01vorbis" + b"\x00" * 23
# An AVIF still: an ftyp box, but no clip.
AVIF_HEAD = b"\x00\x00\x00\x1cftypavif\x00\x00\x00\x00avifmif1miaf"


def gif_bytes(
    colours: tuple[tuple[int, int, int], ...] = ((255, 0, 0), (0, 0, 255)), frame_ms: int = 500
) -> bytes:
    """An animated GIF, one colour per frame: a clip where a video part holds it."""
    frames = [Image.new("RGB", (16, 16), colour) for colour in colours]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=frame_ms, loop=0)
    return buffer.getvalue()


def wav_bytes(seconds: float = 0.2, frequency: float = 440.0, rate: int = 16_000) -> bytes:
    """A mono 16-bit WAV of one tone."""
    frames = int(seconds * rate)
    samples = bytearray()
    for index in range(frames):
        value = int(12_000 * math.sin(2 * math.pi * frequency * index / rate))
        samples += value.to_bytes(2, "little", signed=True)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(rate)
        out.writeframes(bytes(samples))
    return buffer.getvalue()


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def video_data_url(data: bytes = MP4_HEAD, media_type: str = "video/mp4") -> str:
    return f"data:{media_type};base64,{b64(data)}"
