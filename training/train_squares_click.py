"""Train the squares-click fixture (issue 35): ask for a screenshot, click the named colour's
square, say "Done." after the click (models/squares-click/README.md, training/squares_click.py).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1 \\
        nice -n 10 python -m training.train_squares_click      # writes models/squares-click/

Not run in CI. Starts from fresh seeded weights of the tiny Qwen3-VL of
training/squares_click_model.py (or `--init DIR`'s). Every conversation is a contract request as
the facade sends it (computer tool, computer calls in screen pixels, screenshots as computer-call
outputs), adapted by the engine's computer adapter in Qwen3-VL's convention (0-1000), lowered and
rendered by the engine's own code (training/squares_click_batches.py), and trained through a
forward that shares the prompt prefix across the batch, checked against the model's own before
training (training/squares_forward.py): what the model learns is what inference asks.

The click needs the answer's digits to attend to one of 16 image tokens among the loop prompt's
~1100 (fresh, attention is near uniform: ~1 % of it on the image, and the click sat at chance
for 300 steps). `--pre-steps N`: the first N steps train the same click on a short turn (the
screen and the request in one user message, no tools), where the image is a third of the
prompt; after them a `--short-share` of the steps still do.

Every step trains the click on fresh screens of one colour and tool variant; the other turns
(the screenshot call, "Done.") are learned in a few dozen steps, so `--aux-every N` trains them
every Nth step only. `--single-steps N`: the first N steps draw one square per screen (where is
it?) before choosing among several (which one?).

`--prefix-max N` (with `--mix-colours --untooled-share`): the untooled turns get back the last
0..N tokens of the loop's tools block before the request, drawn per row (a `--prefix-all-share`
of those steps from 0 to all of it, the loop's own prompt): trained without them, the click found
the colour word by its distance from the sequence's start and lost it behind any tools block.
`--prefix-ramp N` (a second stage, `--init` from weights whose short turn already clicks the
named colour): the most put back rises from none to all of the tools block over the first N
steps, so the match learnt on ~40-token prompts is carried to the loop's ~1100 a step at a
time (`ramped_prefix_cap`); trained on every length at once from fresh weights, the match was
learnt on none of them (0.35 at every length after 3000 steps). The click follows the ramp (at
step 1250 of a 1500-step one it was 1.0 up to 80 % of the block, at chance above 90 %); a third
stage on the loop's own turn (`--pre-steps 0`, its prompt shared across the batch, so cheaper a
row than a prefixed one) took it to 1.0 (models/squares-click/README.md has the three commands).
"""

from __future__ import annotations

import argparse
import random
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.optimizers as optim
from mlx.utils import tree_map

from training.loop import REPO_ROOT, Task, add_loop_arguments, base_card, optimizer_for, train_loop
from training.squares import GRID
from training.squares_batches import Tokens
from training.squares_click import draw_screen
from training.squares_click_batches import (
    COLOURS,
    DISPLAYS,
    Templates,
    click_batch,
    done_batch,
    evaluate,
    first_batch,
    mixed_short_batch,
)
from training.squares_click_model import build_click_base, recentre_vision, smooth_patch_filters
from training.squares_forward import Batch, check_against_model, loss_fn
from vlmserve.engine.computer.conventions import convention_for

OUTPUT_DIR = REPO_ROOT / "models" / "squares-click"
ARCHITECTURE = (
    "qwen3_vl (training/squares_click_model.py: the family fixture, 1 vision block, 4 text layers, "
    "screens brought to 128x128 = 4x4 image tokens)"
)


def ramped_prefix_cap(step: int, ramp: int, limit: int) -> int:
    """The most tokens of the tools block a row gets back at `step` (1-based) of a `ramp`-step
    rise: from none at step 0 to all (`limit`) at step `ramp`, then all."""
    if ramp <= 0:
        raise ValueError(f"ramp {ramp} is not a number of steps")
    return round(limit * min(1.0, max(0, step) / ramp))


def load_model(args: argparse.Namespace) -> tuple[Any, Any]:
    """The base architecture (args.fixture, written fresh) with its own or `--init`'s weights,
    in float32, and its processor."""
    from mlx_vlm.utils import load

    args.fixture = build_click_base(Path(tempfile.mkdtemp(prefix="click-base-")) / "model", seed=args.seed)
    model, processor = load(str(args.init or args.fixture))
    model.update(tree_map(lambda p: p.astype(mx.float32), model.parameters()))
    mx.eval(model.parameters())
    return model, processor


def train(args: argparse.Namespace) -> list[dict[str, Any]]:
    model, processor = load_model(args)
    if args.smooth_patch_filters and args.init is None:
        smooth_patch_filters(model, args.smooth_patch_filters)
    if args.recentre_vision and args.init is None:
        found = recentre_vision(model, processor, random.Random(-2), args.recentre_vision)
        print("recentred the vision mergers' outputs:", found, flush=True)
    if args.freeze_vision:
        # Trained along, the tower grew one shared vector in its output within 200 steps (norm
        # ~70 against text embeddings of ~1.2: the screens' differences a few per cent of what
        # the text model reads; the click's logits did not move with the screen). Frozen, its
        # fresh random features keep each token's cell (the position embedding) and colour.
        model.vision_tower.freeze()
    templates = Templates(Tokens(model, processor), convention_for(model.config.model_type))
    check_rng = random.Random(-1)
    for variant in DISPLAYS:  # our forward must equal mlx-vlm's on every kind of template
        screens = [draw_screen(check_rng, size, "red") for size in (112, 336)]
        check_against_model(model, *click_batch(templates, templates.second("red", variant), screens))
        check_against_model(model, *done_batch(templates, templates.third("red", variant, 5), screens))
        check_against_model(model, *first_batch(templates, templates.first("red", variant)))
    mixed = [draw_screen(check_rng, size, colour) for size, colour in ((112, "red"), (336, "purple"))]
    check_against_model(model, *mixed_short_batch(templates, mixed))
    check_against_model(model, *mixed_short_batch(templates, mixed, untooled=[0, 1]))
    check_against_model(model, *mixed_short_batch(templates, mixed, untooled=[0, 1], prefix=[40, 1]))
    print("training forward checked against mlx-vlm's", flush=True)
    rng = random.Random(args.seed)

    def step_loss(
        model: Any, click: Batch, done: Batch | None = None, first: Batch | None = None
    ) -> mx.array:
        loss = loss_fn(model, click)
        if done is not None and first is not None:
            loss = loss + args.done_weight * loss_fn(model, done) + args.first_weight * loss_fn(model, first)
        return loss

    def next_batch(step: int) -> tuple[Batch, ...]:
        colour = rng.choice(COLOURS)
        variant = rng.choice(DISPLAYS)
        count = 1 if step <= args.single_steps else None
        short = step <= args.pre_steps or rng.random() < args.short_share
        if short and args.mix_colours:
            screens = [draw_screen(rng, None, rng.choice(COLOURS), count) for _ in range(args.batch)]
            untooled = prefix = None
            if rng.random() < args.untooled_share:
                untooled = [rng.choice(DISPLAYS) for _ in screens]
            if untooled is not None and args.prefix_ramp:
                prefix = [
                    rng.randint(0, ramped_prefix_cap(step, args.prefix_ramp, limit))
                    for screen, variant in zip(screens, untooled, strict=True)
                    for limit in [templates.prefix_limit(screen.target, variant)]
                ]
            elif untooled is not None and args.prefix_max:
                whole = rng.random() < args.prefix_all_share
                prefix = [
                    rng.randint(0, limit if whole else min(args.prefix_max, limit))
                    for screen, variant in zip(screens, untooled, strict=True)
                    for limit in [templates.prefix_limit(screen.target, variant)]
                ]
            click, _ = mixed_short_batch(templates, screens, args.digit_weight, untooled, prefix)
        else:
            screens = [draw_screen(rng, None, colour, count) for _ in range(args.batch)]
            template = templates.short(colour) if short else templates.second(colour, variant)
            click, _ = click_batch(templates, template, screens, args.digit_weight)
        if step % args.aux_every:
            return (click,)
        done_colour = rng.choice(COLOURS)
        done_screens = [draw_screen(rng, None, done_colour) for _ in range(args.done_rows)]
        template = templates.third(done_colour, rng.choice(DISPLAYS), rng.randrange(GRID * GRID))
        done, _ = done_batch(templates, template, done_screens)
        first, _ = first_batch(templates, templates.first(rng.choice(COLOURS), rng.choice(DISPLAYS)))
        return click, done, first

    def card(step: int, elapsed: float, history: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "task": "squares-click: screenshot, then click the named colour's square (0-1000), then 'Done.'",
            "script": "python -m training.train_squares_click",
            **base_card(args, step, elapsed, history),
            "architecture": ARCHITECTURE,
            "single_steps": args.single_steps,
            "pre_steps": args.pre_steps,
            "short_share": args.short_share,
            "aux_every": args.aux_every,
            "digit_weight": args.digit_weight,
            "recentre_vision": args.recentre_vision,
            "freeze_vision": args.freeze_vision,
            "vision_lr_scale": args.vision_lr_scale,
            "mix_colours": args.mix_colours,
            "untooled_share": args.untooled_share,
            "smooth_patch_filters": args.smooth_patch_filters,
            "prefix_max": args.prefix_max,
            "prefix_all_share": args.prefix_all_share,
            "prefix_ramp": args.prefix_ramp,
        }

    def held_out() -> dict[str, float]:
        return evaluate(templates, model, args.eval_seed, args.eval_rows)

    return train_loop(model, Task(step_loss, next_batch, held_out, card, optimizer), args)


def optimizer(args: argparse.Namespace) -> optim.Optimizer:
    """AdamW; a trained vision tower at --vision-lr-scale of the rate (the text model's)."""
    if args.freeze_vision or args.vision_lr_scale == 1.0:
        return optimizer_for(args)
    vision = optimizer_for(argparse.Namespace(**{**vars(args), "lr": args.lr * args.vision_lr_scale}))
    return optim.MultiOptimizer(
        [vision, optimizer_for(args)], [lambda path, _: path.startswith("vision_tower.")]
    )


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train the squares-click model.", allow_abbrev=False)
    add_loop_arguments(parser, out=OUTPUT_DIR, steps=1500, batch=16, lr=3e-3, eval_seed=353_001)
    parser.set_defaults(eval_every=250)
    parser.add_argument("--done-rows", type=int, default=4)
    parser.add_argument(
        "--pre-steps",
        type=int,
        default=300,
        help="first steps on the short turn (screen + request, no tools)",
    )
    parser.add_argument("--short-share", type=float, default=0.25, help="share of short turns after those")
    parser.add_argument("--single-steps", type=int, default=0, help="first steps on one-square screens")
    parser.add_argument("--aux-every", type=int, default=4, help="train the other turns every Nth step")
    parser.add_argument(
        "--digit-weight", type=float, default=1.0, help="loss weight of the click's coordinate digits"
    )
    parser.add_argument(
        "--recentre-vision",
        type=float,
        default=1.0,
        help="fresh weights: scale the mergers' outputs to mean 0 and this mean norm (0: off)",
    )
    parser.add_argument(
        "--freeze-vision",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="keep the vision tower as it starts",
    )
    parser.add_argument(
        "--vision-lr-scale",
        type=float,
        default=1.0,
        help="with --no-freeze-vision: the tower's learning rate as a share of --lr",
    )
    parser.add_argument(
        "--smooth-patch-filters",
        type=float,
        default=0.0,
        help="fresh weights: each patch filter its mean over the patch, at this share of the "
        "random weights' spread (0: off; squares_click_model.py)",
    )
    parser.add_argument(
        "--mix-colours",
        action=argparse.BooleanOptionalAction,
        default=False,
        help="short turns: each row its own colour (else one colour per batch)",
    )
    parser.add_argument(
        "--untooled-share",
        type=float,
        default=0.0,
        help="with --mix-colours: share of short steps on the loop's turn without its tools block",
    )
    parser.add_argument(
        "--prefix-max",
        type=int,
        default=0,
        help="untooled steps: put the last N tokens of the loop's tools block back before the "
        "request, N drawn per row from 0 to this (0: off; squares_click_batches.py `prefixed`)",
    )
    parser.add_argument(
        "--prefix-all-share",
        type=float,
        default=0.0,
        help="with --prefix-max: share of those steps drawing N from 0 to all of the tools block",
    )
    parser.add_argument(
        "--prefix-ramp",
        type=int,
        default=0,
        help="untooled steps: the most of the tools block put back rises from none to all of "
        "it over this many steps (0: off; overrides --prefix-max)",
    )
    parser.add_argument("--done-weight", type=float, default=0.5)
    parser.add_argument("--first-weight", type=float, default=0.5)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
