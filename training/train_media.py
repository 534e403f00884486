"""Train a media fixture: the tiny Qwen3-VL that answers the squares-video task, or the tiny
Gemma 4 that answers the beeps task (models/squares-video/README.md, models/beeps-audio/README.md).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1 \\
        python -m training.train_media --kind video     # writes models/squares-video/
    ... python -m training.train_media --kind audio     # writes models/beeps-audio/

Not run in CI. Starts from fresh seeded weights of training/media_model.py's architectures
(family fixtures with their real processors), so the result is a model directory the unchanged
`mlx_vlm.load` reads. Every --eval-every steps the model is saved (a stopped run leaves a
model; `--init DIR` continues from one).

Data: every step is one conversation shape of training/media_conversations.py with fresh clips
through the model's own processor, plus a text-only row: the question without its clip
(-> `no video` / `no audio`). The loss is the cross-entropy of the answer tokens (the end of
turn included).
"""

from __future__ import annotations

import argparse
import random
import tempfile
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import numpy as np
from mlx.utils import tree_map

from training import beeps, squares_video
from training.loop import REPO_ROOT, Task, add_loop_arguments, base_card, train_loop
from training.media_batches import (
    Batch,
    audio_batch,
    build_batch,
    controls_batch,
    loss_fn,
    row_exact_match,
    video_batch,
)
from training.media_conversations import MARKERS, SHAPES, MediaKind, render, user_clip
from training.media_model import build_audio_base, build_video_base

OUTPUT_DIRS = {"video": REPO_ROOT / "models" / "squares-video", "audio": REPO_ROOT / "models" / "beeps-audio"}
BUILDERS = {"video": build_video_base, "audio": build_audio_base}
TASKS = {
    "video": "squares-video: answer 'A then B' for the square's colours in order, 'no video' without a clip",
    "audio": "beeps: answer '<N> low|high', 'no beeps' for noise only, 'no audio' without a clip",
}
ARCHITECTURES = {
    "video": "qwen3_vl (training/media_model.py: the family fixture, 1 vision block, 4 text layers, "
    "128-px video frames)",
    "audio": "gemma4 (training/media_model.py: the family fixture + audio tower without conformer "
    "blocks, dense MLP, 4 text layers)",
}


def evaluate(model: Any, processor: Any, kind: MediaKind, seed: int, rows: int) -> dict[str, float]:
    """Teacher-forced exact match per shape on held-out clips, and the controls."""
    rng = random.Random(seed)
    hits: dict[str, list[bool]] = defaultdict(list)
    draw = video_batch if kind == "video" else audio_batch
    for shape in SHAPES:
        hits[shape].extend(row_exact_match(model, draw(processor, rng, shape, rows)).tolist())
    prompt = render(user_clip(kind), processor.tokenizer)
    if kind == "video":  # reversed clips: the answer swaps
        clips = [squares_video.draw_clip(rng, 8).reversed() for _ in range(rows)]
        control = build_batch(
            processor, prompt, [c.answer for c in clips], videos=[c.channels_first() for c in clips]
        )
        hits["reversed"].extend(row_exact_match(model, control).tolist())
    else:  # noise only
        silent = [beeps.draw_clip(rng, count=0, duration=2.4) for _ in range(rows)]
        control = build_batch(
            processor, prompt, [c.answer for c in silent], audio=[c.samples for c in silent]
        )
        hits["silent"].extend(row_exact_match(model, control).tolist())
    hits[f"no_{kind}"].extend(row_exact_match(model, controls_batch(processor, kind)).tolist())
    return {name: float(np.mean(values)) for name, values in hits.items()}


def train(args: argparse.Namespace) -> list[dict[str, Any]]:
    from mlx_vlm.utils import load

    kind: MediaKind = args.kind
    base = BUILDERS[kind](Path(tempfile.mkdtemp(prefix=f"{kind}-base-")), seed=args.seed)
    args.fixture = base
    model, processor = load(str(args.init or base))
    model.update(tree_map(lambda p: p.astype(mx.float32), model.parameters()))
    mx.eval(model.parameters())
    shapes = sorted(args.shapes or SHAPES)
    # The one-turn shapes are cheap (no tools preamble) and teach perception: drawn more often.
    weights = [args.user_weight if shape.startswith("user_") else 1.0 for shape in shapes]
    data_rng = random.Random(args.seed)
    control = controls_batch(processor, kind)
    draw = video_batch if kind == "video" else audio_batch

    def step_loss(model: Any, batch: Batch, control: Batch) -> mx.array:
        return loss_fn(model, batch) + float(args.control_weight) * loss_fn(model, control)

    def next_batch(step: int) -> tuple[Batch, Batch]:
        shape = data_rng.choices(shapes, weights)[0]
        marker = data_rng.choice(MARKERS)
        return draw(processor, data_rng, shape, args.batch, marker), control

    def held_out() -> dict[str, float]:
        return evaluate(model, processor, kind, args.eval_seed, args.eval_rows)

    def card(step: int, elapsed: float, history: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "task": TASKS[kind],
            "script": f"python -m training.train_media --kind {kind}",
            **base_card(args, step, elapsed, history),
            "architecture": ARCHITECTURES[kind],
            "shapes": dict(zip(shapes, weights, strict=True)),
        }

    return train_loop(model, Task(step_loss, next_batch, held_out, card), args)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train the media fixture.", allow_abbrev=False)
    parser.add_argument("--kind", choices=sorted(OUTPUT_DIRS), required=True, help="which fixture to train")
    # Small batches, many steps: these tiny models sit at chance until the answer tokens learn
    # to attend to the clip, which takes a number of updates more than a number of clips.
    add_loop_arguments(parser, out=Path(), steps=2500, batch=8, lr=3e-3, eval_seed=555_001)
    parser.set_defaults(eval_every=500, eval_rows=16)
    parser.add_argument("--control-weight", type=float, default=0.25, help="loss weight of the no-clip row")
    parser.add_argument(
        "--user-weight", type=float, default=3.0, help="how much more often the one-turn shapes are drawn"
    )
    parser.add_argument(
        "--shape",
        dest="shapes",
        action="append",
        choices=sorted(SHAPES),
        help="train on this conversation shape only (repeatable; default: all)",
    )
    args = parser.parse_args(argv)
    if args.out == Path():
        args.out = OUTPUT_DIRS[args.kind]
    return args


def main(argv: Sequence[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
