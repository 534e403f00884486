"""Bounded clip decoding (engine/media/) on real files built here (cv2.VideoWriter, wave): good
clips decode to the right frames, rates and samples; damaged, mislabelled and over-limit ones are
refused within seconds naming the limit and its setting; the worker's time limit holds; nothing
is written to disk. Each decode runs in a worker process, hence the marker."""

from __future__ import annotations

import io
import math
import os
import time
import wave
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cv2
import numpy as np
import pytest
from PIL import Image

from vlmserve.common.images import ImageLimits
from vlmserve.engine.media import (
    AUDIO_SAMPLE_RATE,
    MediaError,
    MediaLimits,
    decode_audio,
    decode_video,
    start_decoders,
    worker,
)
from vlmserve.engine.metrics import EngineMetrics
from vlmserve.engine.v1 import engine_pb2 as pb

from ._flac import flac_bytes

pytestmark = pytest.mark.needs_model  # starts decoding worker processes

RED, GREEN, BLUE, YELLOW = (230, 20, 20), (20, 200, 20), (20, 20, 230), (230, 230, 20)
# A refusal (or any answer) comes this fast, whatever the clip: bounds are checked before decoding.
PROMPT_S = 5.0


def video_bytes(
    directory: Path,
    colours: list[tuple[int, int, int]],
    fps: float,
    size: tuple[int, int] = (112, 112),
    fourcc: str = "mp4v",
    suffix: str = ".mp4",
) -> bytes:
    """A clip whose frame i is all colours[i] (RGB), encoded by OpenCV."""
    path = directory / f"clip-{len(colours)}-{fps}-{size[0]}x{size[1]}-{fourcc}{suffix}"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*fourcc), fps, size)
    assert writer.isOpened(), fourcc
    for colour in colours:
        writer.write(np.full((size[1], size[0], 3), colour[::-1], dtype=np.uint8))
    writer.release()
    return path.read_bytes()


def wav_bytes(
    seconds: float, rate: int = 44_100, channels: int = 2, frequency: float = 440.0, width: int = 2
) -> bytes:
    """A WAV of a sine tone, the same on every channel."""
    t = np.arange(round(seconds * rate)) / rate
    tone = 0.5 * np.sin(2 * math.pi * frequency * t)
    pcm = (tone * 32767).astype("<i2") if width == 2 else ((tone + 1) * 127.5).astype(np.uint8)
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(channels)
        out.setsampwidth(width)
        out.setframerate(rate)
        out.writeframes(np.repeat(pcm, channels).tobytes())
    return buffer.getvalue()


def without_duration(webm: bytes) -> bytes:
    """The WebM with its Duration element voided, as a browser's MediaRecorder writes it: the
    header gives no frame count, so the decoder counts frames (bounded by the duration limit)."""
    at = webm.index(b"\x44\x89")  # Duration: 2-byte ID, size 0x88, an 8-byte float
    assert webm[at + 2] == 0x88
    return webm[:at] + b"\xec\x89" + bytes(9) + webm[at + 11 :]  # a Void element of the same length


def gif_bytes(colours: list[tuple[int, int, int]], frame_ms: int) -> bytes:
    """An animated GIF, each frame one colour for `frame_ms`."""
    frames = [Image.new("RGB", (64, 48), colour) for colour in colours]
    buffer = io.BytesIO()
    frames[0].save(buffer, format="GIF", save_all=True, append_images=frames[1:], duration=frame_ms, loop=0)
    return buffer.getvalue()


def tone_flac(seconds: float, rate: int, channels: int, *, length_known: bool = True) -> bytes:
    t = np.arange(round(seconds * rate)) / rate
    tone = (0.5 * np.sin(2 * math.pi * 440.0 * t) * 32767).astype(np.int16)
    return flac_bytes(np.repeat(tone[:, None], channels, axis=1), rate, length_known=length_known)


def png(colour: tuple[int, int, int], size: tuple[int, int] = (64, 48)) -> bytes:
    buffer = io.BytesIO()
    Image.new("RGB", size, colour).save(buffer, format="PNG")
    return buffer.getvalue()


@pytest.fixture(scope="module")
def clips(tmp_path_factory: pytest.TempPathFactory) -> dict[str, bytes]:
    directory = tmp_path_factory.mktemp("clips")
    made = {
        # A squares-video shape: 8 frames at 2 fps, colour A then colour B.
        "a then b": video_bytes(directory, [RED] * 4 + [BLUE] * 4, 2.0),
        "3 s at 10 fps": video_bytes(directory, [GREEN] * 10 + [YELLOW] * 10 + [BLUE] * 10, 10.0),
        "webm": video_bytes(directory, [RED] * 10 + [GREEN] * 10, 10.0, fourcc="VP80", suffix=".webm"),
        "avi": video_bytes(directory, [BLUE] * 6, 2.0, fourcc="MJPG", suffix=".avi"),
        "640x480": video_bytes(directory, [YELLOW] * 4, 2.0, size=(640, 480)),
        "long": video_bytes(directory, [GREEN] * 600, 30.0, size=(320, 240)),
        "4k": video_bytes(directory, [RED] * 8, 2.0, size=(3840, 2160)),
        "gif": gif_bytes([RED, GREEN, BLUE, YELLOW], 500),
    }
    made["webm without duration"] = without_duration(made["webm"])
    return made


def colour_of(frame: np.ndarray) -> tuple[int, int, int]:
    r, g, b = (round(float(v)) for v in frame.reshape(-1, 3).mean(axis=0))
    return r, g, b


def close(a: tuple[int, int, int], b: tuple[int, int, int]) -> bool:
    return all(abs(x - y) <= 12 for x, y in zip(a, b, strict=True))


GOOD_VIDEO = [
    # (clip, sampling, limits, shape, fps, duration, source frames, colours of the frames)
    ("a then b", pb.VideoSampling(), MediaLimits(), (8, 112, 112, 3), 2.0, 4.0, 8, [RED] * 4 + [BLUE] * 4),
    (
        "a then b",
        pb.VideoSampling(fps=1.0),
        MediaLimits(),
        (4, 112, 112, 3),
        1.0,
        4.0,
        8,
        [RED, RED, BLUE, BLUE],
    ),
    ("a then b", pb.VideoSampling(max_frames=2), MediaLimits(), (2, 112, 112, 3), 0.5, 4.0, 8, [RED, BLUE]),
    (
        "3 s at 10 fps",
        pb.VideoSampling(),
        MediaLimits(),
        (6, 112, 112, 3),
        2.0,
        3.0,
        30,
        [GREEN, GREEN, YELLOW, YELLOW, BLUE, BLUE],
    ),
    (
        "3 s at 10 fps",
        pb.VideoSampling(),
        MediaLimits(video_fps=1.0),
        (3, 112, 112, 3),
        1.0,
        3.0,
        30,
        [GREEN, YELLOW, BLUE],
    ),
    ("webm", pb.VideoSampling(), MediaLimits(), (4, 112, 112, 3), 2.0, 2.0, 20, [RED, RED, GREEN, GREEN]),
    ("avi", pb.VideoSampling(), MediaLimits(), (6, 112, 112, 3), 2.0, 3.0, 6, [BLUE] * 6),
    # Frames over the per-frame bound are scaled down as they are decoded, aspect kept.
    (
        "640x480",
        pb.VideoSampling(),
        MediaLimits(max_video_frame_pixels=160 * 120),
        (4, 120, 160, 3),
        2.0,
        2.0,
        4,
        [YELLOW] * 4,
    ),
    (
        "640x480",
        pb.VideoSampling(max_pixels=320 * 240),
        MediaLimits(),
        (4, 240, 320, 3),
        2.0,
        2.0,
        4,
        [YELLOW] * 4,
    ),
    # 20 s at 30 fps: 16 frames (the default budget), found by seeking, not decoding all 600.
    ("long", pb.VideoSampling(), MediaLimits(), (16, 240, 320, 3), 0.8, 20.0, 600, [GREEN] * 16),
    # An animated GIF sent as a clip: 4 frames of 0.5 s.
    ("gif", pb.VideoSampling(), MediaLimits(), (4, 48, 64, 3), 2.0, 2.0, 4, [RED, GREEN, BLUE, YELLOW]),
    (
        "webm without duration",
        pb.VideoSampling(),
        MediaLimits(),
        (4, 112, 112, 3),
        2.0,
        2.0,
        20,
        [RED, RED, GREEN, GREEN],
    ),
]


@pytest.mark.parametrize(
    ("clip", "sampling", "limits", "shape", "fps", "duration", "source_frames", "colours"),
    GOOD_VIDEO,
    ids=[f"{row[0]}-{i}" for i, row in enumerate(GOOD_VIDEO)],
)
def test_a_good_clip_decodes_to_its_sampled_frames(
    clips: dict[str, bytes],
    clip: str,
    sampling: pb.VideoSampling,
    limits: MediaLimits,
    shape: tuple[int, ...],
    fps: float,
    duration: float,
    source_frames: int,
    colours: list[tuple[int, int, int]],
) -> None:
    started = time.monotonic()
    decoded = decode_video(pb.VideoPart(data=clips[clip], sampling=sampling), limits)
    assert time.monotonic() - started < 30  # a worker's first start imports OpenCV and SciPy
    assert decoded.frames.shape == shape
    assert decoded.frames.dtype == np.uint8
    assert decoded.fps == pytest.approx(fps)
    assert decoded.duration_s == pytest.approx(duration)
    assert decoded.source_frames == source_frames
    seen = [colour_of(frame) for frame in decoded.frames]
    assert all(close(a, b) for a, b in zip(seen, colours, strict=True)), seen  # RGB, in order


REFUSED_VIDEO: list[tuple[str, Callable[[dict[str, bytes]], pb.VideoPart], MediaLimits, str, str, str]] = [
    # (name, the part, limits, code, field, words the message must hold)
    (
        "damaged container",
        lambda c: pb.VideoPart(data=c["a then b"][:32] + os.urandom(4000)),
        MediaLimits(),
        "damaged",
        "video.data",
        "could not be decoded",
    ),
    (
        "truncated clip",
        lambda c: pb.VideoPart(data=c["3 s at 10 fps"][: len(c["3 s at 10 fps"]) // 3]),
        MediaLimits(),
        "damaged",
        "video.data",
        "could not be decoded",
    ),
    (
        "mislabelled",
        lambda c: pb.VideoPart(data=c["a then b"], media_type="video/webm"),
        MediaLimits(),
        "media_type",
        "video.media_type",
        "does not match",
    ),
    (
        "audio sent as video",
        lambda c: pb.VideoPart(data=wav_bytes(0.5), media_type="video/mp4"),
        MediaLimits(),
        "media_type",
        "video.data",
        "unsupported",
    ),
    (
        "over the bytes",
        lambda c: pb.VideoPart(data=c["a then b"]),
        MediaLimits(max_video_bytes=1000),
        "bytes",
        "video.data",
        "--max-video-bytes",
    ),
    (
        "over the duration",
        lambda c: pb.VideoPart(data=c["long"]),
        MediaLimits(max_video_seconds=10),
        "duration",
        "video.data",
        "--max-video-seconds",
    ),
    (
        "frames too large",
        lambda c: pb.VideoPart(data=c["640x480"]),
        MediaLimits(max_video_source_pixels=100_000),
        "source_pixels",
        "video.data",
        "--max-video-source-pixels",
    ),
    (
        "too many frames asked",
        lambda c: pb.VideoPart(data=c["a then b"], sampling=pb.VideoSampling(max_frames=65)),
        MediaLimits(),
        "frames",
        "video.sampling.max_frames",
        "--max-video-frames",
    ),
    (
        "frames x pixels",
        lambda c: pb.VideoPart(data=c["640x480"]),
        MediaLimits(max_video_pixels=640 * 480 * 3),
        "pixels",
        "video.sampling",
        "--max-video-pixels",
    ),
    (
        "a file reference",
        lambda c: pb.VideoPart(file_id="file-abc"),
        MediaLimits(),
        "file_id",
        "video.file_id",
        "file_id",
    ),
    (
        "no data",
        lambda c: pb.VideoPart(media_type="video/mp4"),
        MediaLimits(),
        "empty",
        "video.data",
        "no data",
    ),
    (
        "counted past the duration",
        lambda c: pb.VideoPart(data=c["webm without duration"]),
        MediaLimits(max_video_seconds=1),
        "duration",
        "video.data",
        "more than 1 s long",
    ),
]


@pytest.mark.parametrize(
    ("name", "make", "limits", "code", "field", "words"), REFUSED_VIDEO, ids=[row[0] for row in REFUSED_VIDEO]
)
def test_a_bad_clip_is_refused_naming_the_limit(
    clips: dict[str, bytes],
    name: str,
    make: Callable[[dict[str, bytes]], pb.VideoPart],
    limits: MediaLimits,
    code: str,
    field: str,
    words: str,
) -> None:
    metrics = EngineMetrics()
    started = time.monotonic()
    with pytest.raises(MediaError) as caught:
        decode_video(make(clips), limits, metrics=metrics.media)
    assert time.monotonic() - started < PROMPT_S
    assert (caught.value.code, caught.value.field) == (code, field)
    assert words in str(caught.value)
    assert (
        metrics.registry.get_sample_value(
            "vlmserve_engine_media_refused_clips_total", {"kind": "video", "reason": code}
        )
        == 1.0
    )


def test_the_decode_time_limit_kills_the_worker(clips: dict[str, bytes]) -> None:
    limits = MediaLimits(decode_timeout_s=0.001)
    started = time.monotonic()
    with pytest.raises(MediaError) as caught:
        decode_video(pb.VideoPart(data=clips["long"], sampling=pb.VideoSampling(max_frames=64)), limits)
    assert time.monotonic() - started < PROMPT_S
    assert caught.value.code == "timeout"
    assert "--media-decode-timeout-s" in str(caught.value)
    # The next clip gets a fresh worker and decodes.
    assert decode_video(pb.VideoPart(data=clips["a then b"]), MediaLimits()).frames.shape[0] == 8


def test_the_memory_limit_is_a_refusal_not_a_crash(clips: dict[str, bytes]) -> None:
    # 8 frames of 3840x2160 (200 MB) do not fit a 300 MiB worker (its imports take ~200).
    limits = MediaLimits(decode_memory_mib=300, max_video_pixels=10**9, max_video_frame_pixels=10**8)
    with pytest.raises(MediaError) as caught:
        decode_video(pb.VideoPart(data=clips["4k"]), limits)
    assert caught.value.code == "memory"
    assert "--media-decode-memory-mib" in str(caught.value)
    # Within the default limit the same clip decodes.
    roomy = MediaLimits(max_video_pixels=10**9, max_video_frame_pixels=10**8)
    assert decode_video(pb.VideoPart(data=clips["4k"]), roomy).frames.shape == (8, 2160, 3840, 3)


FRAMES_GOOD = [
    # (frames, their fps, sampling, shape, fps, duration, colours)
    ([RED, RED, GREEN, GREEN], 2.0, pb.VideoSampling(), (4, 48, 64, 3), 2.0, 2.0, [RED, RED, GREEN, GREEN]),
    ([RED, RED, GREEN, GREEN], 0.0, pb.VideoSampling(), (4, 48, 64, 3), 2.0, 2.0, [RED, RED, GREEN, GREEN]),
    (
        [RED, RED, GREEN, GREEN, BLUE, BLUE],
        2.0,
        pb.VideoSampling(fps=1.0),
        (3, 48, 64, 3),
        1.0,
        3.0,
        [RED, GREEN, BLUE],
    ),
    (
        [RED] * 10 + [BLUE] * 10,
        4.0,
        pb.VideoSampling(max_frames=4),
        (4, 48, 64, 3),
        0.8,
        5.0,
        [RED, RED, BLUE, BLUE],
    ),
]


@pytest.mark.parametrize(
    ("colours", "given_fps", "sampling", "shape", "fps", "duration", "expected"), FRAMES_GOOD
)
def test_frames_sent_as_images_are_sampled_and_decoded_as_images(
    colours: list[tuple[int, int, int]],
    given_fps: float,
    sampling: pb.VideoSampling,
    shape: tuple[int, ...],
    fps: float,
    duration: float,
    expected: list[tuple[int, int, int]],
) -> None:
    frames = pb.VideoFrames(
        frames=[pb.ImagePart(data=png(c), media_type="image/png") for c in colours], fps=given_fps
    )
    decoded = decode_video(pb.VideoPart(frames=frames, sampling=sampling), MediaLimits())
    assert decoded.frames.shape == shape
    assert (decoded.fps, decoded.duration_s, decoded.source_frames) == (
        pytest.approx(fps),
        duration,
        len(colours),
    )
    assert [colour_of(frame) for frame in decoded.frames] == expected


def test_frames_of_other_sizes_take_the_first_ones_size() -> None:
    frames = pb.VideoFrames(
        frames=[pb.ImagePart(data=png(RED, (64, 48))), pb.ImagePart(data=png(BLUE, (128, 96)))]
    )
    decoded = decode_video(pb.VideoPart(frames=frames), MediaLimits())
    assert decoded.frames.shape == (2, 48, 64, 3)
    assert [colour_of(frame) for frame in decoded.frames] == [RED, BLUE]


FRAMES_REFUSED = [
    # (frames, limits, code, field, words)
    (
        [pb.ImagePart(data=png(RED)), pb.ImagePart(data=b"\x89PNG\r\n\x1a\nbroken")],
        MediaLimits(),
        "image",
        "video.frames.frames[1]",
        "could not be decoded",
    ),
    (
        [pb.ImagePart(data=png(RED), media_type="image/jpeg")],
        MediaLimits(),
        "image",
        "video.frames.frames[0]",
        "does not match",
    ),
    (
        [pb.ImagePart(data=png(RED, (640, 480)))],
        MediaLimits(images=ImageLimits(max_pixels=1000)),
        "image",
        "video.frames.frames[0]",
        "over the limit",
    ),
    (
        [pb.ImagePart(data=png(RED))] * 21,
        MediaLimits(max_video_seconds=10),
        "duration",
        "video.frames",
        "--max-video-seconds",
    ),
    ([], MediaLimits(), "empty", "video.frames.frames", "no frames"),
]


@pytest.mark.parametrize(("frames", "limits", "code", "field", "words"), FRAMES_REFUSED)
def test_bad_frames_are_refused_naming_the_frame(
    frames: list[pb.ImagePart], limits: MediaLimits, code: str, field: str, words: str
) -> None:
    with pytest.raises(MediaError) as caught:
        decode_video(pb.VideoPart(frames=pb.VideoFrames(frames=frames)), limits)
    assert (caught.value.code, caught.value.field) == (code, field)
    assert words in str(caught.value)


GOOD_AUDIO = [
    # (bytes, duration)
    (wav_bytes(1.5, rate=44_100, channels=2), 1.5),
    (wav_bytes(1.0, rate=16_000, channels=1), 1.0),
    (wav_bytes(0.5, rate=48_000, channels=1, width=1), 0.5),  # 8-bit
    (wav_bytes(2.0, rate=22_050, channels=6), 2.0),
    (tone_flac(1.0, rate=44_100, channels=2), 1.0),
    (tone_flac(0.5, rate=16_000, channels=1), 0.5),
]


@pytest.mark.parametrize(("data", "duration"), GOOD_AUDIO)
def test_a_good_wav_or_flac_decodes_to_16_khz_mono(data: bytes, duration: float) -> None:
    metrics = EngineMetrics()
    decoded = decode_audio(pb.AudioPart(data=data), MediaLimits(), metrics=metrics.media)
    assert decoded.sample_rate == AUDIO_SAMPLE_RATE == 16_000
    assert decoded.samples.dtype == np.float32 and decoded.samples.ndim == 1
    assert decoded.samples.shape[0] == round(duration * 16_000)
    assert decoded.duration_s == pytest.approx(duration)
    # Still the 440 Hz tone at amplitude 0.5 after downmixing and resampling.
    spectrum = np.abs(np.fft.rfft(decoded.samples))
    assert np.fft.rfftfreq(len(decoded.samples), 1 / 16_000)[spectrum.argmax()] == pytest.approx(440, abs=2)
    assert float(np.abs(decoded.samples).max()) == pytest.approx(0.5, abs=0.03)
    assert metrics.registry.get_sample_value("vlmserve_engine_audio_seconds_total") == pytest.approx(duration)
    assert metrics.registry.get_sample_value("vlmserve_engine_media_clips_total", {"kind": "audio"}) == 1.0


def test_a_wav_header_claiming_hours_decodes_what_its_bytes_hold() -> None:
    """The length comes from the bytes there, not the data chunk's claim: no over-allocation."""
    decoded = decode_audio(pb.AudioPart(data=lying_wav()), MediaLimits())
    assert decoded.duration_s == pytest.approx(0.1)
    assert decoded.samples.shape[0] == 1600


def lying_wav() -> bytes:
    """A WAV whose data chunk claims 4 GB: its header says ~12 hours."""
    data = bytearray(wav_bytes(0.1, rate=48_000, channels=2))
    index = data.index(b"data")
    data[index + 4 : index + 8] = (0xFFFFFF00).to_bytes(4, "little")
    return bytes(data)


REFUSED_AUDIO = [
    # (name, part, limits, code, field, words)
    (
        "sample rate",
        pb.AudioPart(data=wav_bytes(0.2, rate=96_000)),
        MediaLimits(),
        "sample_rate",
        "audio.data",
        "--max-audio-sample-rate",
    ),
    (
        "duration",
        pb.AudioPart(data=wav_bytes(3.0, rate=8_000)),
        MediaLimits(max_audio_seconds=2),
        "duration",
        "audio.data",
        "--max-audio-seconds",
    ),
    (
        "channels",
        pb.AudioPart(data=wav_bytes(0.2, channels=3)),
        MediaLimits(max_audio_channels=2),
        "channels",
        "audio.data",
        "--max-audio-channels",
    ),
    (
        "bytes",
        pb.AudioPart(data=wav_bytes(1.0)),
        MediaLimits(max_audio_bytes=1000),
        "bytes",
        "audio.data",
        "--max-audio-bytes",
    ),
    (
        "damaged",
        pb.AudioPart(data=wav_bytes(0.2)[:12] + os.urandom(400)),
        MediaLimits(),
        "damaged",
        "audio.data",
        "could not be decoded",
    ),
    (
        "damaged mp3",
        pb.AudioPart(data=b"ID3\x04\x00\x00\x00\x00\x00\x00" + os.urandom(2000)),
        MediaLimits(),
        "damaged",
        "audio.data",
        "could not be decoded",
    ),
    (
        "mislabelled",
        pb.AudioPart(data=wav_bytes(0.2), media_type="audio/mpeg"),
        MediaLimits(),
        "media_type",
        "audio.media_type",
        "does not match",
    ),
    ("not audio", pb.AudioPart(data=png(RED)), MediaLimits(), "media_type", "audio.data", "unsupported"),
    (
        "a file reference",
        pb.AudioPart(file_id="file-abc"),
        MediaLimits(),
        "file_id",
        "audio.file_id",
        "file_id",
    ),
    ("no data", pb.AudioPart(), MediaLimits(), "empty", "audio.data", "no data"),
    (
        "flac without its length",
        pb.AudioPart(data=tone_flac(0.5, 16_000, 1, length_known=False), media_type="audio/flac"),
        MediaLimits(),
        "damaged",
        "audio.data",
        "does not give its length",
    ),
    (
        "flac over the duration",
        pb.AudioPart(data=tone_flac(3.0, 8_000, 1)),
        MediaLimits(max_audio_seconds=2),
        "duration",
        "audio.data",
        "--max-audio-seconds",
    ),
]


@pytest.mark.parametrize(
    ("name", "part", "limits", "code", "field", "words"), REFUSED_AUDIO, ids=[row[0] for row in REFUSED_AUDIO]
)
def test_a_bad_audio_clip_is_refused_naming_the_limit(
    name: str, part: pb.AudioPart, limits: MediaLimits, code: str, field: str, words: str
) -> None:
    started = time.monotonic()
    with pytest.raises(MediaError) as caught:
        decode_audio(part, limits)
    assert time.monotonic() - started < PROMPT_S
    assert (caught.value.code, caught.value.field) == (code, field)
    assert words in str(caught.value)


def test_decoding_writes_no_file(
    clips: dict[str, bytes], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Clips reach the demuxer from memory: a fresh worker (its own memory limit makes it one)
    with an empty temp dir and working dir leaves both empty."""
    scratch, work = tmp_path / "tmp", tmp_path / "cwd"
    scratch.mkdir()
    work.mkdir()
    monkeypatch.setenv("TMPDIR", str(scratch))
    monkeypatch.chdir(work)
    limits = MediaLimits(decode_memory_mib=1999)
    assert decode_video(pb.VideoPart(data=clips["webm"]), limits).frames.shape[0] == 4
    assert decode_audio(pb.AudioPart(data=wav_bytes(0.5)), limits).samples.shape[0] == 8000
    assert list(scratch.iterdir()) == []
    assert list(work.iterdir()) == []


def live_workers() -> list[int]:
    """The process ids of the decoding workers alive now (idle, decoding or starting), read from
    the worker module's registry under its lock."""
    with worker._IDLE_LOCK:
        return sorted(w.process.pid for w in worker._LIVE)


def test_started_decoders_take_the_first_clip() -> None:
    """start_decoders (an engine calls it as it loads) starts the workers without waiting for
    their imports; the first clip uses one of them instead of starting a process (seconds of
    imports), and starting again (a second load) adds none."""
    limits = MediaLimits(decode_memory_mib=1998)  # a memory limit no other test uses: its own workers
    before = set(live_workers())
    start_decoders(limits)
    started = {w.process.pid for w in worker._IDLE if w.memory_mib == 1998}
    assert len(started) == worker.DECODE_SLOTS
    assert set(live_workers()) - before == started
    decode_audio(pb.AudioPart(data=wav_bytes(0.2)), limits)
    start_decoders(limits)
    assert {w.process.pid for w in worker._IDLE if w.memory_mib == 1998} == started
    assert set(live_workers()) - before == started


def test_stopped_decoders_leave_no_process() -> None:
    """stop_workers (the engine's exit) ends every worker: idle ones on their closed pipe (exit
    0), one still starting killed; the next clip starts a fresh one."""
    limits = MediaLimits(decode_memory_mib=1997)
    decode_audio(pb.AudioPart(data=wav_bytes(0.2)), limits)  # one ready, idle worker
    idle = [w for w in worker._IDLE if w.memory_mib == 1997 and w.ready]
    start_decoders(limits)  # and one starting
    workers = [w for w in worker._IDLE if w.memory_mib == 1997]
    assert len(idle) == 1 and len(workers) == worker.DECODE_SLOTS
    worker.stop_workers()
    assert live_workers() == [] and worker._IDLE == []
    assert all(w.process.poll() is not None for w in workers)
    assert idle[0].process.returncode == 0  # left on its own, not killed
    assert decode_audio(pb.AudioPart(data=wav_bytes(0.2)), limits).samples.shape[0] == 3200


def test_clips_decode_side_by_side() -> None:
    """Request-preparation threads decode at once: each gets its clip, at most DECODE_SLOTS workers
    run, and the pool keeps no more than that."""
    clips = [wav_bytes(0.25 * (n + 1), rate=16_000, channels=1) for n in range(6)]
    with ThreadPoolExecutor(max_workers=6) as pool:
        decoded = list(pool.map(lambda data: decode_audio(pb.AudioPart(data=data), MediaLimits()), clips))
    assert [clip.samples.shape[0] for clip in decoded] == [4000 * (n + 1) for n in range(6)]
    assert len(worker._IDLE) <= worker.DECODE_SLOTS
