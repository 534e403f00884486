"""Train the tiny qwen2_vl to see: the squares task in every conversation shape
(models/qwen2-vl-squares/README.md).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1 \\
        python -m training.train_squares            # writes models/qwen2-vl-squares/

Not run in CI. Starts from fresh weights (seeded) of the fixture's architecture
(models/qwen2-vl-tiny: config, tokenizer, chat template, processor), so the trained model is a
drop-in replacement that the unchanged `mlx_vlm.load` reads.

Data: every step takes one conversation template (a shape of `training.squares_conversations`,
rendered through `lower_messages` + the engine's `render_prompt` + mlx-vlm's `prepare_inputs`),
fills BATCH rows with fresh squares images and their answers, and adds one text-only row: the
agent's first turn (-> the `screenshot` tool call) or a control with the image missing
(-> `no image`). The loss is the cross-entropy of the reply tokens (`<|im_end|>` included).

Measured (this 2-core CPU, shared with teammates' test runs; OPENBLAS_NUM_THREADS=1, which was
~1.5x faster than 2 BLAS threads under that contention): the committed model is this script's
defaults, seed 0 — 1500 steps of batch 32 (+1 text-only row), AdamW lr 1e-3 (100 warmup steps,
cosine to 1e-5), 1.06 s/step, 26.5 minutes in all (~0.65 s/step on an idle machine). Teacher-
forced accuracy on held-out images (32 per template): ~0.2 at step 500, 1.00 on every image shape
from step 750, the screenshot call from step 1000; final answer-token loss 0.0008. Generation
through the engine's render path (`python -m training.squares_eval`, 50 fresh images per shape):
1.00 on every shape, controls answer `no image`. Weights: float16, 3.8 MB (directory 4.1 MB).
"""

from __future__ import annotations

import argparse
import random
from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import numpy as np

from training.loop import REPO_ROOT, Task, add_loop_arguments, base_card, fresh_model, train_loop
from training.squares_batches import Template, Tokens, build_templates, draw_samples, image_batch, text_batch
from training.squares_forward import check_against_model, loss_fn, row_exact_match

OUTPUT_DIR = REPO_ROOT / "models" / "qwen2-vl-squares"

# How often each shape is drawn (variants of a shape share its weight). The agent's tool-result
# shapes come in three tool declarations each, so they get a little more.
SHAPE_WEIGHTS: dict[str, float] = {
    "user_image": 1.0,
    "user_image_text_first": 1.0,
    "agent_tool_text_image": 1.5,
    "agent_tool_image_only": 1.5,
    "assistant_image": 1.0,
    "assistant_image_only": 0.75,
    "system_image": 0.75,
    "agent_follow_up": 1.0,
}


def evaluate(
    model: Any,
    tokens: Tokens,
    image_templates: Sequence[Template],
    text_templates: Sequence[Template],
    seed: int,
    rows: int,
) -> dict[str, float]:
    """Teacher-forced exact match per shape on held-out images (= greedy decoding is right)."""
    rng = random.Random(seed)
    hits: dict[str, list[bool]] = defaultdict(list)
    for template in image_templates:
        batch, _ = image_batch(template, draw_samples(rng, rows), tokens)
        hits[template.shape].extend(row_exact_match(model, batch).tolist())
    for template in text_templates:
        batch, _ = text_batch(template, tokens)
        group = "agent_call" if template.shape == "agent_call" else "controls"
        hits[group].extend(row_exact_match(model, batch).tolist())
    return {shape: float(np.mean(values)) for shape, values in hits.items()}


def train(args: argparse.Namespace) -> list[dict[str, Any]]:
    model, processor = fresh_model(args.fixture, args.seed, args.init)
    tokens = Tokens(model, processor)
    image_templates, text_templates = build_templates(tokens)
    by_shape: dict[str, list[Template]] = defaultdict(list)
    for template in image_templates:
        by_shape[template.shape].append(template)
    shapes = sorted(by_shape)
    weights = [SHAPE_WEIGHTS.get(shape, 1.0) for shape in shapes]
    print(
        f"{len(image_templates)} image templates over {shapes}; {len(text_templates)} text-only", flush=True
    )

    data_rng = random.Random(args.seed)
    # Our forward (shared prefix, logits only where needed) must equal mlx-vlm's on every template.
    for template in image_templates:
        batch, full = image_batch(template, draw_samples(random.Random(-1), 2), tokens)
        check_against_model(model, batch, full)
    for template in text_templates:
        batch, full = text_batch(template, tokens)
        check_against_model(model, batch, full)

    def step_loss(model: Any, image: Any, text: Any) -> mx.array:
        return loss_fn(model, image) + float(args.text_weight) * loss_fn(model, text)

    def next_batch(step: int) -> tuple[Any, Any]:
        shape = data_rng.choices(shapes, weights)[0]
        template = data_rng.choice(by_shape[shape])
        image, _ = image_batch(template, draw_samples(data_rng, args.batch), tokens)
        text, _ = text_batch(text_templates[step % len(text_templates)], tokens)
        return image, text

    def held_out() -> dict[str, float]:
        return evaluate(model, tokens, image_templates, text_templates, args.eval_seed, args.eval_rows)

    def card(step: int, elapsed: float, history: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "task": "squares: answer '<N> <colour>', or 'no image' when the image is missing",
            "script": "python -m training.train_squares",
            **base_card(args, step, elapsed, history),
        }

    return train_loop(model, Task(step_loss, next_batch, held_out, card), args)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train the squares model.", allow_abbrev=False)
    add_loop_arguments(parser, out=OUTPUT_DIR, steps=1500, batch=32, lr=1e-3, eval_seed=777_001)
    parser.add_argument("--text-weight", type=float, default=0.5, help="loss weight of the text-only row")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
