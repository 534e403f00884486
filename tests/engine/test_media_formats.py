"""The clip formats we accept (vlmserve.common.clips) are the ones the engine's decoders decode:
each format, encoded here for real (OpenCV's writer, PIL, libsndfile through soundfile, LAME for
MP3), is accepted by the format check and decoded by `media/decoders.py` as the worker runs it;
each refused one (Ogg Opus, M4A) fails in the decoders too, so the check refuses early what would
only fail later. Then the beeps task's MP3 and Ogg Vorbis clips, through the engine's bounded
decoder (a worker process), keep their length, rate, count and pitch."""

from __future__ import annotations

import io
import random
from pathlib import Path

import cv2
import numpy as np
import pytest
import soundfile  # type: ignore[import-untyped]  # no stubs
from PIL import Image

from training.beeps import PITCHES, SAMPLE_RATE, draw_clip
from vlmserve.engine.media import MediaError, MediaLimits, decode_audio, decoders
from vlmserve.engine.media.limits import check_format
from vlmserve.engine.v1 import engine_pb2 as pb

LIMITS = MediaLimits()
FRAMES = np.random.default_rng(0).integers(0, 256, (6, 48, 64, 3), dtype=np.uint8)
# 0.2 s of 440 Hz AAC in an iTunes-style M4A (brand `M4A `), made once with PyAV's AAC encoder
# (FFmpeg's; not a dependency): no encoder here writes AAC, and no decoder here reads it.
M4A = Path(__file__).resolve().parents[1] / "data" / "clips" / "tone.m4a"


def video(suffix: str, fourcc: str, tmp_path: Path) -> bytes:
    path = tmp_path / f"clip{suffix}"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*fourcc), 2.0, (64, 48))
    assert writer.isOpened(), (suffix, fourcc)
    for frame in FRAMES:
        writer.write(frame)
    writer.release()
    return path.read_bytes()


def gif() -> bytes:
    buffer = io.BytesIO()
    images = [Image.fromarray(frame) for frame in FRAMES]
    images[0].save(buffer, format="GIF", save_all=True, append_images=images[1:], duration=500, loop=0)
    return buffer.getvalue()


def encoded(samples: np.ndarray, format: str, subtype: str, rate: int = SAMPLE_RATE) -> bytes:
    buffer = io.BytesIO()
    soundfile.write(buffer, samples, rate, format=format, subtype=subtype)
    return buffer.getvalue()


TONE = (0.5 * np.sin(2 * np.pi * 440 * np.arange(SAMPLE_RATE) / SAMPLE_RATE)).astype(np.float32)


@pytest.mark.parametrize(
    ("suffix", "fourcc", "expected"),
    [
        (".mp4", "mp4v", b"isom"),
        (".mov", "mp4v", b"qt  "),
        (".m4v", "mp4v", b"M4V "),
        (".3gp", "mp4v", b"3gp4"),
        (".avi", "MJPG", b"AVI "),
        (".mkv", "XVID", b"\x42\x82"),  # EBML, DocType matroska
        (".webm", "VP80", b"\x42\x82"),  # EBML, DocType webm
        (".webm", "VP90", b"\x42\x82"),
    ],
)
def test_each_accepted_container_decodes(suffix: str, fourcc: str, expected: bytes, tmp_path: Path) -> None:
    data = video(suffix, fourcc, tmp_path)
    assert expected in data[:48]
    found = check_format(data, "", "video")
    assert found == ("avi" if suffix == ".avi" else "webm" if suffix in (".mkv", ".webm") else "mp4")
    frames, fps, duration, count = decoders.video_frames(data, 2.0, 16, 64 * 48, LIMITS)
    assert (frames.shape, fps, duration, count) == ((6, 48, 64, 3), 2.0, 3.0, 6)


def test_an_animated_gif_decodes_as_a_clip() -> None:
    data = gif()
    assert check_format(data, "image/gif", "video") == "gif"
    frames, fps, duration, count = decoders.video_frames(data, 2.0, 16, 64 * 48, LIMITS)
    assert (frames.shape, fps, duration, count) == ((6, 48, 64, 3), 2.0, 3.0, 6)


@pytest.mark.parametrize(
    ("format", "subtype", "expected"),
    [
        ("WAV", "PCM_16", "wav"),
        ("WAV", "FLOAT", "wav"),
        ("FLAC", "PCM_16", "flac"),
        ("MP3", "MPEG_LAYER_III", "mp3"),
        ("OGG", "VORBIS", "ogg"),
    ],
)
def test_each_accepted_audio_format_decodes(format: str, subtype: str, expected: str) -> None:
    data = encoded(TONE, format, subtype)
    assert check_format(data, "", "audio") == expected
    samples, duration = decoders.audio_samples(data, expected, LIMITS)
    assert (samples.shape, duration) == ((SAMPLE_RATE,), 1.0)


def _decodes_as_audio(data: bytes) -> list[str]:
    decoded = []
    for name in ("wav", "mp3", "flac", "ogg"):
        try:
            decoders.audio_samples(data, name, LIMITS)
        except MediaError:
            continue
        decoded.append(name)
    return decoded


def test_ogg_opus_is_refused_and_no_decoder_reads_it() -> None:
    data = encoded(TONE, "OGG", "OPUS")
    assert data[:4] == b"OggS" and b"OpusHead" in data[:64]
    for kind in ("audio", "video"):
        with pytest.raises(MediaError) as caught:
            check_format(data, "audio/ogg", kind)
        assert (caught.value.code, caught.value.field) == ("media_type", f"{kind}.data")
    assert _decodes_as_audio(data) == []


def test_m4a_is_refused_and_no_decoder_reads_it() -> None:
    data = M4A.read_bytes()
    assert data[4:12] == b"ftypM4A "
    for kind in ("audio", "video"):
        with pytest.raises(MediaError) as caught:
            check_format(data, "", kind)
        assert (caught.value.code, caught.value.field) == ("media_type", f"{kind}.data")
    assert _decodes_as_audio(data) == []
    with pytest.raises(MediaError) as caught:
        decoders.video_frames(data, 2.0, 16, 64 * 48, LIMITS)  # an MP4 with no video stream
    assert caught.value.code == "damaged"


# ---- the beeps task's clips as MP3 and Ogg Vorbis, through the engine's bounded decoder ----------


def beeps(samples: np.ndarray) -> tuple[int, float]:
    """(tone bursts, the loudest frequency in Hz) of 16 kHz samples: 10 ms windows louder than
    half the loudest one, counted as runs, and the spectrum's peak."""
    window = SAMPLE_RATE // 100
    loudness = np.sqrt(np.mean(samples[: len(samples) // window * window].reshape(-1, window) ** 2, axis=1))
    loud = loudness > loudness.max() / 2
    bursts = int(np.sum(loud[1:] & ~loud[:-1]) + loud[0])
    spectrum = np.abs(np.fft.rfft(samples))
    return bursts, float(np.fft.rfftfreq(len(samples), 1 / SAMPLE_RATE)[int(np.argmax(spectrum))])


@pytest.mark.needs_model  # decodes in the worker processes
@pytest.mark.parametrize(
    ("format", "subtype", "media_type"),
    [("MP3", "MPEG_LAYER_III", "audio/mpeg"), ("OGG", "VORBIS", "audio/ogg")],
)
@pytest.mark.parametrize("count", [3, 5])  # 3 high, 5 low (the seeded draws)
def test_beeps_clips_decode_to_their_samples(format: str, subtype: str, media_type: str, count: int) -> None:
    clip = draw_clip(random.Random(count), count=count)
    data = encoded(clip.samples, format, subtype)
    decoded = decode_audio(pb.AudioPart(data=data, media_type=media_type), LIMITS)
    assert decoded.sample_rate == SAMPLE_RATE
    assert decoded.samples.shape == clip.samples.shape  # the encoder's padding is trimmed
    assert decoded.duration_s == pytest.approx(len(clip.samples) / SAMPLE_RATE)
    bursts, peak = beeps(decoded.samples)
    assert bursts == count
    assert peak == pytest.approx(PITCHES[clip.pitch], abs=2.0)  # 0.5 Hz bins over 2 s
    # Lossy, but the same waveform: in step with what was encoded, not shifted by the codec's delay.
    assert np.corrcoef(decoded.samples, clip.samples)[0, 1] > 0.9
