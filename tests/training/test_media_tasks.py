"""The squares-video and beeps clips are what their READMEs say (fast: no model)."""

from __future__ import annotations

import io
import itertools
import random
import wave

import numpy as np
import pytest

from training import beeps, squares_video
from training.squares import BACKGROUND, PALETTE


def _square_colours(frames: np.ndarray) -> list[str]:
    """The one non-white colour of each frame (asserting there is exactly one square)."""
    colours = []
    for frame in frames:
        ys, xs = np.nonzero((frame != BACKGROUND).any(axis=-1))
        side_y, side_x = ys.max() - ys.min() + 1, xs.max() - xs.min() + 1
        assert side_y == side_x and 18 <= side_x <= 24 and len(ys) == side_x * side_y
        # Inside one 28-px cell of the 4x4 grid.
        assert ys.min() // 28 == ys.max() // 28 and xs.min() // 28 == xs.max() // 28
        (colour,) = [name for name, rgb in PALETTE.items() if tuple(frame[ys[0], xs[0]]) == rgb]
        colours.append(colour)
    return colours


@pytest.mark.parametrize("seed", range(20))
def test_video_clip_changes_colour_half_way(seed: int) -> None:
    clip = squares_video.draw_clip(random.Random(seed))
    frames = clip.frames
    assert frames.dtype == np.uint8 and frames.shape[1:] == (112, 112, 3)
    count = len(frames)
    assert count in (4, 6, 8)
    assert _square_colours(frames) == [clip.first] * (count // 2) + [clip.second] * (count // 2)
    assert clip.first != clip.second and clip.answer == f"{clip.first} then {clip.second}"
    backwards = clip.reversed()
    assert backwards.answer == f"{clip.second} then {clip.first}"
    assert _square_colours(backwards.frames) == _square_colours(frames)[::-1]
    assert backwards.channels_first().shape == (count, 3, 112, 112)


def test_video_clips_cover_every_ordered_pair_and_length() -> None:
    clips = squares_video.make_clips(7, 600)
    assert {c.answer for c in clips} == {f"{a} then {b}" for a in PALETTE for b in PALETTE if a != b}
    assert {len(c.frames) for c in clips} == {4, 6, 8}
    assert squares_video.make_clips(7, 3)[2].answer == clips[2].answer  # seeded


def test_clip_through_mp4_keeps_its_frames_and_colours_roughly() -> None:
    clip = squares_video.draw_clip(random.Random(4), 6)
    sent = clip.through_mp4()
    assert sent.answer == clip.answer and sent.frames.shape == clip.frames.shape
    difference = np.abs(sent.frames.astype(int) - clip.frames.astype(int))
    assert 0 < difference.mean() < 10  # lossy, but the same picture
    for frame, colour in zip(sent.frames, [clip.first] * 3 + [clip.second] * 3, strict=True):
        ys, xs = np.nonzero(np.abs(frame.astype(int) - 255).sum(axis=-1) > 200)
        centre = frame[int(np.median(ys)), int(np.median(xs))].astype(int)
        assert np.abs(centre - PALETTE[colour]).max() < 60


def test_blank_clip_is_background_only() -> None:
    clip = squares_video.blank_clip(6)
    assert clip.frames.shape == (6, 112, 112, 3) and (clip.frames == BACKGROUND).all()


def _tone_starts(samples: np.ndarray) -> list[int]:
    """Sample offsets where the 10-ms energy rises above the noise."""
    window = beeps.SAMPLE_RATE // 100
    energy = np.sqrt(np.mean(samples[: len(samples) // window * window].reshape(-1, window) ** 2, axis=1))
    loud = energy > 0.1
    return [
        index * window for index in range(len(loud)) if loud[index] and (index == 0 or not loud[index - 1])
    ]


@pytest.mark.parametrize("seed", range(20))
def test_beeps_clip_has_its_count_and_pitch(seed: int) -> None:
    clip = beeps.draw_clip(random.Random(seed))
    samples = clip.samples
    assert samples.dtype == np.float32 and samples.ndim == 1
    assert len(samples) / beeps.SAMPLE_RATE in beeps.DURATIONS
    starts = _tone_starts(samples)
    assert len(starts) == clip.count and 1 <= clip.count <= 5
    # 0.2 s tone + 0.2 s gap between onsets (to the 10-ms window).
    assert all(abs((b - a) - 6400) <= 160 for a, b in itertools.pairwise(starts))
    spectrum = np.abs(np.fft.rfft(samples))
    peak = np.fft.rfftfreq(len(samples), 1 / beeps.SAMPLE_RATE)[spectrum.argmax()]
    assert abs(peak - beeps.PITCHES[clip.pitch]) < 10
    assert 0.3 <= np.abs(samples).max() <= 0.8 + 0.05
    assert clip.answer == f"{clip.count} {clip.pitch}"


def test_silent_clip_is_noise_only() -> None:
    for clip in beeps.make_silent_clips(3, 10):
        assert clip.answer == "no beeps" and _tone_starts(clip.samples) == []
        assert 0 < np.abs(clip.samples).max() < 0.1


def test_wav_is_16_khz_mono_pcm_of_the_samples() -> None:
    clip = beeps.make_clips(5, 1)[0]
    with wave.open(io.BytesIO(clip.wav_bytes())) as wav:
        assert (wav.getnchannels(), wav.getframerate(), wav.getsampwidth()) == (1, 16_000, 2)
        pcm = np.frombuffer(wav.readframes(wav.getnframes()), dtype="<i2") / 32767
    assert np.abs(pcm - clip.samples).max() < 1e-4


def test_beeps_cover_every_answer() -> None:
    answers = {clip.answer for clip in beeps.make_clips(11, 300)}
    assert answers == {f"{n} {pitch}" for n in range(1, 6) for pitch in ("low", "high")}
