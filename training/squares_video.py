"""The squares-video task: one square moving over a white grid, changing colour half-way
(models/squares-video/README.md).

A clip has 4, 6 or 8 frames at 2 fps, each 112x112 white with one square (18-24 px, in a random
cell of the 4x4 grid of 28-px cells, a new cell each frame). The first half of the frames show
colour A, the second half colour B != A; the answer is ``"A then B"`` (30 classes). The order is
only in the motion: the reversed clip's answer is ``"B then A"``, and the first frame alone holds
A but not B. The sizes and palette are the image squares task's (training/squares.py).
"""

from __future__ import annotations

import io
import random
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from training.squares import BACKGROUND, CELL, GRID, IMAGE_SIZE, MAX_SIDE, MIN_SIDE, PALETTE

FRAME_COUNTS = (4, 6, 8)
FPS = 2.0
VIDEO_QUESTION = "What colours does the square have, in order?"
NO_VIDEO_ANSWER = "no video"
COLOURS = tuple(sorted(PALETTE))


def colours_answer(first: str, second: str) -> str:
    return f"{first} then {second}"


@dataclass(frozen=True)
class SquaresClip:
    frames: np.ndarray  # (T, H, W, 3) uint8 RGB
    first: str
    second: str

    @property
    def answer(self) -> str:
        return colours_answer(self.first, self.second)

    def reversed(self) -> SquaresClip:
        """The clip played backwards: its answer is `second then first`."""
        return SquaresClip(frames=self.frames[::-1].copy(), first=self.second, second=self.first)

    def frame_png(self, index: int = 0) -> bytes:
        buffer = io.BytesIO()
        Image.fromarray(self.frames[index]).save(buffer, format="PNG")
        return buffer.getvalue()

    def frame_pngs(self) -> list[bytes]:
        return [self.frame_png(index) for index in range(len(self.frames))]

    def mp4_bytes(self) -> bytes:
        """The clip as a client sends it: an MP4 at the task's 2 fps (`encode_mp4`)."""
        return encode_mp4(self.frames)

    def through_mp4(self) -> SquaresClip:
        """The clip as a client's MP4 brings it back: encoded with OpenCV's MPEG-4 Part 2 writer
        (what the e2e tests send) and decoded, with its blocky edges and bled colours."""
        return SquaresClip(frames=mp4_roundtrip(self.frames), first=self.first, second=self.second)

    def channels_first(self) -> np.ndarray:
        """(T, 3, H, W), the layout mlx-vlm's video processors take."""
        return np.ascontiguousarray(self.frames.transpose(0, 3, 1, 2))


def draw_frame(rng: random.Random, colour: str) -> np.ndarray:
    frame = np.full((IMAGE_SIZE, IMAGE_SIZE, 3), BACKGROUND, dtype=np.uint8)
    side = rng.randint(MIN_SIDE, MAX_SIDE)
    row, col = divmod(rng.randrange(GRID * GRID), GRID)
    x = col * CELL + rng.randint(0, CELL - side)
    y = row * CELL + rng.randint(0, CELL - side)
    frame[y : y + side, x : x + side] = PALETTE[colour]
    return frame


def encode_mp4(frames: np.ndarray, fps: float = FPS) -> bytes:
    """(T, H, W, 3) RGB frames as an MP4: MPEG-4 Part 2 (`mp4v`), OpenCV's always-available
    encoder, what the e2e tests and the video demo send."""
    import cv2

    height, width = frames.shape[1:3]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "clip.mp4"
        writer = cv2.VideoWriter(str(path), cv2.VideoWriter.fourcc(*"mp4v"), fps, (width, height))
        for frame in frames:
            writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
        writer.release()
        return path.read_bytes()


def mp4_roundtrip(frames: np.ndarray, fps: float = FPS) -> np.ndarray:
    """(T, H, W, 3) RGB frames encoded as an MP4 (`encode_mp4`) and decoded again."""
    import cv2

    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "clip.mp4"
        path.write_bytes(encode_mp4(frames, fps))
        capture = cv2.VideoCapture(str(path))
        decoded = []
        while True:
            ok, frame = capture.read()
            if not ok:
                break
            decoded.append(cv2.cvtColor(frame, cv2.COLOR_BGR2RGB))
        capture.release()
    if len(decoded) != len(frames):
        raise RuntimeError(f"mp4 round trip gave {len(decoded)} of {len(frames)} frames")
    return np.stack(decoded)


def blank_clip(frame_count: int) -> SquaresClip:
    """`frame_count` frames of the background alone (no square; its answer means nothing)."""
    frames = np.full((frame_count, IMAGE_SIZE, IMAGE_SIZE, 3), BACKGROUND, dtype=np.uint8)
    return SquaresClip(frames=frames, first="", second="")


def draw_clip(rng: random.Random, frame_count: int | None = None) -> SquaresClip:
    """One clip from `rng` (advances it); `frame_count` one of FRAME_COUNTS (random if None)."""
    count = frame_count if frame_count is not None else rng.choice(FRAME_COUNTS)
    first, second = rng.sample(COLOURS, 2)
    colours = [first] * (count // 2) + [second] * (count - count // 2)
    frames = np.stack([draw_frame(rng, colour) for colour in colours])
    return SquaresClip(frames=frames, first=first, second=second)


def make_clips(seed: int, n: int) -> list[SquaresClip]:
    """`n` clips from one seeded stream (frame counts drawn too)."""
    rng = random.Random(seed)
    return [draw_clip(rng) for _ in range(n)]
