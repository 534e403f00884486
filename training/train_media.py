"""Train a media fixture: the tiny Qwen3-VL that answers the squares-video task, or the tiny
Gemma 4 that answers the beeps task (models/squares-video/README.md, models/beeps-audio/README.md).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1 \\
        python -m training.train_media --kind video     # writes models/squares-video/
    ... python -m training.train_media --kind audio     # writes models/beeps-audio/

Not run in CI. Starts from fresh seeded weights of training/media_model.py's architectures
(family fixtures with their real processors), so the result is a model directory the unchanged
`mlx_vlm.load` reads. Every --eval-every steps the model is saved (a stopped run leaves a
model; `--init DIR` continues from one).

Video (what made it learn, models/squares-video/README.md): the vision tower stays at its seeded
weights (--freeze-vision all: trained, its output went to one constant for every clip within
100 steps) with its position table zeroed and its mergers' last layers scaled 8x about a blank
clip's output (--contrast 8): a 20-px square is 1-4 of a clip's 64 tokens, and only when it
stands out that far did the text layers learn to look at it. Half the clips go through an MP4
round trip, as clients send them.

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
import mlx.nn as nn
import numpy as np
from mlx.utils import tree_map

from training import beeps, squares_video
from training.loop import REPO_ROOT, Task, add_loop_arguments, base_card, train_loop
from training.media_batches import (
    Batch,
    answer_logits,
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


def clip_spread(model: Any, processor: Any, seed: int, clips: int = 16) -> dict[str, float]:
    """How much the vision tower's output differs between clips: per video token, the std across
    `clips` fresh 8-frame clips, over the token's mean norm (the merger's and each deepstack
    merger's). A collapsed tower (every clip the same features) reads ~0; a random one ~0.2."""
    rng = random.Random(seed)
    drawn = [squares_video.draw_clip(rng, 8).channels_first() for _ in range(clips)]
    inputs = processor(text=["<|video_pad|>"] * clips, videos=drawn, fps=[squares_video.FPS] * clips)
    features, deepstack = model.vision_tower(
        mx.array(inputs["pixel_values_videos"]), mx.array(inputs["video_grid_thw"])
    )
    spread = {}
    for name, value in [("merger", features), *((f"deepstack{i}", d) for i, d in enumerate(deepstack))]:
        per_clip = np.array(value.astype(mx.float32)).reshape(clips, -1, value.shape[-1])
        across = np.linalg.norm(per_clip.std(axis=0), axis=-1).mean()
        norm = np.linalg.norm(per_clip, axis=-1).mean()
        spread[name] = float(across / max(norm, 1e-9))
    return spread


def contrast_vision(model: Any, processor: Any, gain: float) -> None:
    """Make a plain white clip the vision tower's zero and a square stand out `gain` times more:
    the position table is zeroed (the text layers' M-RoPE places every video token already; the
    table only made the background of each token differ) and each merger's last layer scaled about
    its output for a white clip. A square is 1-4 of a clip's 64 tokens: at gain 1 a text layer's
    near-uniform attention at init dilutes it ~80x, and the answer never learnt to look."""
    tower = model.vision_tower
    tower.pos_embed.weight = mx.zeros_like(tower.pos_embed.weight)
    blank = squares_video.blank_clip(8).channels_first()
    inputs = processor(text=["<|video_pad|>"], videos=[blank], fps=[squares_video.FPS])
    features, deepstack = tower(mx.array(inputs["pixel_values_videos"]), mx.array(inputs["video_grid_thw"]))
    mergers = [tower.merger, *tower.deepstack_merger_list]
    for merger, value in zip(mergers, [features, *deepstack], strict=True):
        background = value.astype(mx.float32).mean(axis=0)
        last = merger.linear_fc2
        last.weight = last.weight * gain
        last.bias = last.bias * gain + (1 - gain) * background
    mx.eval(tower.parameters())


def answer_nats(model: Any, processor: Any, seed: int, rows: int) -> float:
    """Held-out cross-entropy of a whole answer (nats a row) on one-turn clips: chance is the
    entropy of the classes (ln 30 = 3.4 for the colour pair), 0 when the model reads the clip."""
    rng = random.Random(seed)
    batch = video_batch(processor, rng, "user_clip", rows)
    logits = answer_logits(model, batch).astype(mx.float32)
    losses = nn.losses.cross_entropy(logits, batch.targets, reduction="none") * batch.weights
    return float(losses.sum() / rows)


def train(args: argparse.Namespace) -> list[dict[str, Any]]:
    from mlx_vlm.utils import load

    kind: MediaKind = args.kind
    base = BUILDERS[kind](Path(tempfile.mkdtemp(prefix=f"{kind}-base-")), seed=args.seed)
    args.fixture = base
    model, processor = load(str(args.init or base))
    model.update(tree_map(lambda p: p.astype(mx.float32), model.parameters()))
    mx.eval(model.parameters())
    if kind == "video" and args.init is None:
        contrast_vision(model, processor, args.contrast)
    if kind == "video" and args.freeze_vision != "none":
        # Trained, the tower's output went to one constant within 100 steps (clip_spread 0.2 ->
        # 0.001) and the mergers' alone halved it, before the text layers learnt to read it:
        # Adam's noisy full-size steps outgrow these tiny weights. Frozen random convolutions
        # keep the colours apart; the text layers learn to read them.
        tower = model.vision_tower
        frozen = [tower.patch_embed, tower.pos_embed, *tower.blocks]
        if args.freeze_vision == "all":
            frozen += [tower.merger, *tower.deepstack_merger_list]
        for module in frozen:
            module.freeze()
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
        if kind == "video":
            spread = clip_spread(model, processor, args.eval_seed)
            nats = answer_nats(model, processor, args.eval_seed, args.eval_rows)
            print(
                f"answer nats {nats:.3f} (chance {np.log(30):.2f}); clip spread "
                + " ".join(f"{k}={v:.3f}" for k, v in spread.items()),
                flush=True,
            )
        return evaluate(model, processor, kind, args.eval_seed, args.eval_rows)

    def card(step: int, elapsed: float, history: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "task": TASKS[kind],
            "script": f"python -m training.train_media --kind {kind}",
            **base_card(args, step, elapsed, history),
            "architecture": ARCHITECTURES[kind],
            **({"freeze_vision": args.freeze_vision, "contrast": args.contrast} if kind == "video" else {}),
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
    parser.add_argument(
        "--freeze-vision",
        choices=("none", "tower", "all"),
        default="all",
        help="video: keep at their seeded values the vision tower's patch embedding, position table "
        "and blocks (tower), or those and its mergers (all)",
    )
    parser.add_argument(
        "--contrast",
        type=float,
        default=8.0,
        help="video, fresh weights: a square's features this many times further from a white clip's "
        "(contrast_vision)",
    )
    args = parser.parse_args(argv)
    if args.out == Path():
        args.out = OUTPUT_DIRS[args.kind]
    return args


def main(argv: Sequence[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
