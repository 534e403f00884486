"""Accuracy of the media fixtures by real greedy generation (no server), per conversation shape,
with the controls (models/squares-video/README.md, models/beeps-audio/README.md).

Each conversation is rendered as the engine renders it (training/media_conversations.py) and
answered by `mlx_vlm.generate` with the clips as arrays: frames (T, 3, H, W) uint8 at 2 fps, or
a float32 16 kHz waveform.

    python -m training.media_eval --kind video --n 50
    python -m training.media_eval --kind audio --n 50
"""

from __future__ import annotations

import argparse
import io
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from training import beeps, squares_video
from training.media_conversations import MISSING_ANSWERS, SHAPES, MediaKind, as_image, render, user_clip
from training.train_media import OUTPUT_DIRS

# Not the training seed (0) nor its in-training eval seed (555001).
DEFAULT_EVAL_SEED = 313_131


def generate_reply(
    model: Any,
    processor: Any,
    prompt: str,
    *,
    videos: list[np.ndarray] | None = None,
    audio: list[np.ndarray] | None = None,
    image: Image.Image | None = None,
    max_tokens: int = 12,
) -> str:
    """The model's reply to `prompt`, greedy."""
    from mlx_vlm.generate.dispatch import generate as _generate

    generate: Any = _generate  # annotated for paths; it takes arrays and PIL images too
    kwargs: dict[str, Any] = {}
    if videos:
        kwargs.update(video=videos, fps=squares_video.FPS)
    if audio:
        kwargs["audio"] = audio
    if image is not None:
        kwargs["image"] = [image]
    result = generate(
        model, processor, prompt, max_tokens=max_tokens, temperature=0.0, verbose=False, **kwargs
    )
    return str(result.text).strip()


def _share(hits: list[bool]) -> float:
    return sum(hits) / len(hits)


def evaluate_video(model: Any, processor: Any, seed: int, n: int) -> dict[str, float]:
    template = processor.tokenizer
    clips = squares_video.make_clips(seed, n)
    earlier = squares_video.make_clips(seed + 1, n)
    scores: dict[str, float] = {}
    for shape, build in SHAPES.items():
        hits = []
        for clip, before in zip(clips, earlier, strict=True):
            prompt = render(build("video", before.answer), template)
            videos = (
                [before.channels_first(), clip.channels_first()]
                if shape == "follow_up"
                else [clip.channels_first()]
            )
            hits.append(generate_reply(model, processor, prompt, videos=videos) == clip.answer)
        scores[shape] = _share(hits)
    prompt = render(user_clip("video"), template)
    scores["control_reversed"] = _share(
        [
            generate_reply(model, processor, prompt, videos=[c.reversed().channels_first()])
            == c.reversed().answer
            for c in clips
        ]
    )
    # The first frame alone, as an image: it shows A, never B.
    image_prompt = render(as_image(user_clip("video")), template)
    replies = [
        generate_reply(model, processor, image_prompt, image=Image.open(io.BytesIO(c.frame_png(0))))
        for c in clips
    ]
    scores["control_first_frame_exact"] = _share(
        [reply == c.answer for reply, c in zip(replies, clips, strict=True)]
    )
    scores["control_first_frame_second_colour"] = _share(
        [reply.endswith(f" then {c.second}") for reply, c in zip(replies, clips, strict=True)]
    )
    no_clip = render(user_clip("video", present=False), template)
    scores["control_no_video"] = float(generate_reply(model, processor, no_clip) == MISSING_ANSWERS["video"])
    return scores


def evaluate_audio(model: Any, processor: Any, seed: int, n: int) -> dict[str, float]:
    template = processor.tokenizer
    clips = beeps.make_clips(seed, n)
    earlier = beeps.make_clips(seed + 1, n)
    scores: dict[str, float] = {}
    for shape, build in SHAPES.items():
        hits = []
        for clip, before in zip(clips, earlier, strict=True):
            prompt = render(build("audio", before.answer), template)
            audio = [before.samples, clip.samples] if shape == "follow_up" else [clip.samples]
            hits.append(generate_reply(model, processor, prompt, audio=audio) == clip.answer)
        scores[shape] = _share(hits)
    prompt = render(user_clip("audio"), template)
    silent = beeps.make_silent_clips(seed + 2, n)
    scores["control_silent"] = _share(
        [generate_reply(model, processor, prompt, audio=[c.samples]) == beeps.NO_BEEPS_ANSWER for c in silent]
    )
    no_clip = render(user_clip("audio", present=False), template)
    scores["control_no_audio"] = float(generate_reply(model, processor, no_clip) == MISSING_ANSWERS["audio"])
    return scores


def evaluate(model: Any, processor: Any, kind: MediaKind, seed: int, n: int) -> dict[str, float]:
    return (evaluate_video if kind == "video" else evaluate_audio)(model, processor, seed, n)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0], allow_abbrev=False)
    parser.add_argument("--kind", choices=sorted(OUTPUT_DIRS), required=True)
    parser.add_argument("--model", type=Path, default=None, help="default: the kind's fixture")
    parser.add_argument("--n", type=int, default=50, help="clips per shape")
    parser.add_argument("--seed", type=int, default=DEFAULT_EVAL_SEED)
    args = parser.parse_args(argv)
    from mlx_vlm.utils import load

    model, processor = load(str(args.model or OUTPUT_DIRS[args.kind]))
    for name, value in evaluate(model, processor, args.kind, args.seed, args.n).items():
        print(f"{name:40s} {value:.3f}", flush=True)


if __name__ == "__main__":
    main()
