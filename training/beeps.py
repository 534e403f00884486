"""The beeps task: count short tones and say whether they are high or low
(models/beeps-audio/README.md).

A clip is 16 kHz mono: 1-5 tones of 0.2 s separated by 0.2 s of silence, all 440 Hz ("low")
or all 1760 Hz ("high"), one amplitude in 0.3-0.8, light noise throughout, starting after a
random lead-in. The answer is ``"<N> low"`` or ``"<N> high"`` (10 classes); a clip of noise
only is ``"no beeps"``; a request without audio is ``"no audio"``.
"""

from __future__ import annotations

import io
import random
import wave
from dataclasses import dataclass

import numpy as np

SAMPLE_RATE = 16_000
TONE_S = 0.2
GAP_S = 0.2
MIN_BEEPS = 1
MAX_BEEPS = 5
PITCHES = {"low": 440.0, "high": 1760.0}
MIN_AMPLITUDE = 0.3
MAX_AMPLITUDE = 0.8
NOISE_STD = 0.01
# 5 ms fades: a tone switched on and off abruptly clicks across the whole spectrum.
FADE_S = 0.005
# Clip lengths (s) drawn from: every count fits (5 beeps take 1.8 s). One length: the audio
# tower's tokens (one per 40 ms) then always number 50, and the share of them that hold a tone
# is the count (N/10). With lengths of 2.0-3.0 s that share was ambiguous (3 beeps in 2 s ~ 4
# in 3 s): the tiny model learned the pitch but stayed at chance on the count.
DURATIONS = (2.0,)
AUDIO_QUESTION = "How many beeps, and are they high or low?"
NO_BEEPS_ANSWER = "no beeps"
NO_AUDIO_ANSWER = "no audio"


def beeps_answer(count: int, pitch: str) -> str:
    return f"{count} {pitch}"


@dataclass(frozen=True)
class BeepsClip:
    samples: np.ndarray  # float32 mono at SAMPLE_RATE
    count: int  # 0: noise only
    pitch: str  # "" when count is 0

    @property
    def answer(self) -> str:
        return beeps_answer(self.count, self.pitch) if self.count else NO_BEEPS_ANSWER

    def wav_bytes(self) -> bytes:
        return encode_wav(self.samples)


def encode_wav(samples: np.ndarray, sample_rate: int = SAMPLE_RATE) -> bytes:
    """16-bit PCM mono WAV."""
    pcm = (np.clip(samples, -1.0, 1.0) * 32767).astype("<i2")
    buffer = io.BytesIO()
    with wave.open(buffer, "wb") as out:
        out.setnchannels(1)
        out.setsampwidth(2)
        out.setframerate(sample_rate)
        out.writeframes(pcm.tobytes())
    return buffer.getvalue()


def _tone(frequency: float, amplitude: float) -> np.ndarray:
    n = int(TONE_S * SAMPLE_RATE)
    t = np.arange(n) / SAMPLE_RATE
    envelope = np.ones(n)
    fade = int(FADE_S * SAMPLE_RATE)
    envelope[:fade] = np.linspace(0.0, 1.0, fade)
    envelope[-fade:] = np.linspace(1.0, 0.0, fade)
    return amplitude * envelope * np.sin(2 * np.pi * frequency * t)


def draw_clip(rng: random.Random, count: int | None = None, duration: float | None = None) -> BeepsClip:
    """One clip from `rng` (advances it). `count` 0 gives noise only; None draws 1-5."""
    beeps = rng.randint(MIN_BEEPS, MAX_BEEPS) if count is None else count
    seconds = rng.choice(DURATIONS) if duration is None else duration
    total = round(seconds * SAMPLE_RATE)
    noise = np.random.default_rng(rng.getrandbits(32)).normal(0.0, NOISE_STD, total)
    samples = noise.astype(np.float64)
    pitch = rng.choice(sorted(PITCHES)) if beeps else ""
    if beeps:
        tone = _tone(PITCHES[pitch], rng.uniform(MIN_AMPLITUDE, MAX_AMPLITUDE))
        step = int((TONE_S + GAP_S) * SAMPLE_RATE)
        span = (beeps - 1) * step + len(tone)
        if span > total:
            raise ValueError(f"{beeps} beeps do not fit in {seconds} s")
        start = rng.randint(0, total - span)
        for index in range(beeps):
            offset = start + index * step
            samples[offset : offset + len(tone)] += tone
    return BeepsClip(samples=samples.astype(np.float32), count=beeps, pitch=pitch)


def make_clips(seed: int, n: int) -> list[BeepsClip]:
    """`n` clips with 1-5 beeps from one seeded stream."""
    rng = random.Random(seed)
    return [draw_clip(rng) for _ in range(n)]


def make_silent_clips(seed: int, n: int) -> list[BeepsClip]:
    """`n` noise-only clips (the `no beeps` control)."""
    rng = random.Random(seed)
    return [draw_clip(rng, count=0) for _ in range(n)]
