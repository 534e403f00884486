"""Train the tiny qwen2_vl to copy: return a JSON object or code block with one field or line
changed (training/copying.py, models/qwen2-vl-copying/README.md).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1 \\
        python -m training.train_copying            # writes models/qwen2-vl-copying/

Not run in CI. Fresh weights (seeded) of models/qwen2-vl-tiny's architecture, config, tokenizer
and chat template, so `mlx_vlm.load` reads it unchanged. It is the benchmark's copying workload
(bench/speculative_vs_mlx_vlm.py): a model whose answers repeat its prompt, so prompt lookup has real
acceptance instead of a random model's loops. Text only: each step is BATCH conversations
(default system prompt, the case's prompt as the user turn) rendered with the chat template; the
loss is the cross-entropy of the answer tokens and `<|im_end|>`.

Status (issue 21): models/qwen2-vl-copying copies. By greedy generation, 0.96 of held-out pure
copies are exact and 0.99 of their lines right; on edits, 0.12 exact and 0.69 of lines. Its
README has the two commands that made it. What made it copy was names of the tokenizer's
whole-word pieces (training/copying.py). With names of syllables, every run stalled at 0.47-0.61
of answer tokens right with nothing copied (2,100 steps; wider, lower rope_theta, other lrs),
although the same model learns to repeat a random 20-token sequence in 150 steps. The warm-up on
`repeat_case` (--repeat-steps) and lr 1e-3 without weight decay helped.
`python -m training.copying_eval --model DIR` scores greedy generation on held-out cases.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import numpy as np

from training.copying import CopyCase, copy_case, repeat_case
from training.loop import REPO_ROOT, Task, add_loop_arguments, base_card, fresh_model, train_loop

OUTPUT_DIR = REPO_ROOT / "models" / "qwen2-vl-copying"


def encode(tokenizer: Any, case: CopyCase) -> tuple[list[int], int]:
    """(prompt + answer + <|im_end|> token ids, where the answer starts)."""
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": case.prompt}], tokenize=False, add_generation_prompt=True
    )
    prompt_ids: list[int] = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids: list[int] = tokenizer(case.answer + "<|im_end|>", add_special_tokens=False)["input_ids"]
    return prompt_ids + answer_ids, len(prompt_ids)


def make_batch(
    tokenizer: Any, rng: random.Random, rows: int, unchanged: float = 0.0, repeat: bool = False
) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """(inputs [rows, L] right-padded, flat positions whose next token is an answer token [K],
    those tokens [K], their rows [K]); a share `unchanged` of the rows are pure copies, and with
    `repeat` every row is a `repeat_case` instead."""
    cases = [repeat_case(rng) if repeat else copy_case(rng, unchanged) for _ in range(rows)]
    encoded = [encode(tokenizer, case) for case in cases]
    length = max(len(ids) for ids, _ in encoded) - 1
    inputs = np.zeros((rows, length), dtype=np.int32)
    index: list[int] = []
    targets: list[int] = []
    owners: list[int] = []
    for row, (ids, start) in enumerate(encoded):
        inputs[row, : len(ids) - 1] = ids[:-1]
        for position in range(start - 1, len(ids) - 1):
            index.append(row * length + position)
            targets.append(ids[position + 1])
            owners.append(row)
    return mx.array(inputs), mx.array(index), mx.array(targets), mx.array(owners)


def _answer_logits(model: Any, inputs: mx.array, index: mx.array) -> mx.array:
    """Logits at the answer positions only (the vocabulary projection is most of the cost),
    from a text-only forward with explicit positions (the model would reuse the last call's)."""
    rows, length = inputs.shape
    positions = mx.broadcast_to(mx.arange(length)[None, None], (3, rows, length))
    language_model = model.language_model
    hidden = language_model.model(inputs, position_ids=positions)
    selected = hidden.reshape(rows * length, -1)[index]
    logits: mx.array = language_model.model.embed_tokens.as_linear(selected)
    return logits


def loss_fn(model: Any, inputs: mx.array, index: mx.array, targets: mx.array, owners: mx.array) -> mx.array:
    losses = nn.losses.cross_entropy(_answer_logits(model, inputs, index), targets, reduction="none")
    mean: mx.array = losses.mean()
    return mean


def accuracy(
    model: Any, inputs: mx.array, index: mx.array, targets: mx.array, owners: mx.array
) -> dict[str, float]:
    """Teacher-forced: `exact`, the share of rows whose every answer token is the argmax (then
    greedy decoding is right too); `token`, the share of answer tokens that are."""
    wrong = (mx.argmax(_answer_logits(model, inputs, index), axis=-1) != targets).astype(mx.float32)
    rows = int(inputs.shape[0])
    wrong_per_row = mx.zeros((rows,)).at[owners].add(wrong)
    return {
        "exact": _scalar((wrong_per_row == 0).astype(mx.float32).mean()),
        "token": 1.0 - _scalar(wrong.mean()),
    }


def _scalar(value: mx.array) -> float:
    item: Any = value.item()  # typed int | float | complex
    return float(item)


def overrides_of(args: argparse.Namespace) -> dict[str, Any]:
    """config.json keys the flags change from models/qwen2-vl-tiny's (head width stays 32, so
    the fixture's mrope_section still fits)."""
    overrides: dict[str, Any] = {}
    if args.rope_theta is not None:
        overrides["rope_theta"] = args.rope_theta
    if args.layers is not None:
        overrides["num_hidden_layers"] = args.layers
    if args.hidden is not None:
        overrides.update(
            hidden_size=args.hidden,
            num_attention_heads=args.hidden // 32,
            num_key_value_heads=args.hidden // 64,
            intermediate_size=3 * args.hidden,
        )
    return overrides


def train(args: argparse.Namespace) -> list[dict[str, Any]]:
    args.overrides = overrides_of(args)
    model, processor = fresh_model(args.fixture, args.seed, args.init, args.overrides)
    tokenizer = processor.tokenizer if hasattr(processor, "tokenizer") else processor
    data_rng = random.Random(args.seed)
    held_out = make_batch(tokenizer, random.Random(args.eval_seed), args.eval_rows)
    held_out_copies = make_batch(tokenizer, random.Random(args.eval_seed), args.eval_rows, unchanged=1.0)

    def unchanged_share(step: int) -> float:
        """Pure copies only up to step --copy-steps, then --unchanged of the rows."""
        return 1.0 if step <= args.copy_steps else args.unchanged

    def evaluate() -> dict[str, float]:
        copies = accuracy(model, *held_out_copies)
        return {**accuracy(model, *held_out), **{f"copy_{name}": value for name, value in copies.items()}}

    def card(step: int, elapsed: float, history: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "task": "copying: return the prompt's JSON object / code block with one field or line changed",
            "script": "python -m training.train_copying",
            "config_overrides": args.overrides,
            "repeat_steps": args.repeat_steps,
            "copy_steps": args.copy_steps,
            "unchanged": args.unchanged,
            **base_card(args, step, elapsed, history),
        }

    task = Task(
        loss=loss_fn,
        batch=lambda step: make_batch(
            tokenizer, data_rng, args.batch, unchanged_share(step), repeat=step <= args.repeat_steps
        ),
        evaluate=evaluate,
        card=card,
    )
    return train_loop(model, task, args)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train the copying model.", allow_abbrev=False)
    add_loop_arguments(parser, out=OUTPUT_DIR, steps=2000, batch=16, lr=2e-3, eval_seed=424_242)
    parser.add_argument("--rope-theta", type=float, default=None, help="default: the fixture's")
    parser.add_argument("--layers", type=int, default=None, help="default: the fixture's")
    parser.add_argument("--hidden", type=int, default=None, help="width, heads of 32 (default: the fixture)")
    parser.add_argument("--repeat-steps", type=int, default=0, help="repeat_case rows only up to this step")
    parser.add_argument("--copy-steps", type=int, default=0, help="pure copies only up to this step")
    parser.add_argument("--unchanged", type=float, default=0.0, help="share of pure copies after that")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
