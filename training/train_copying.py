"""Train the tiny qwen2_vl to copy: return a JSON object or code block with one field or line
changed (training/copying.py, models/qwen2-vl-copying/README.md).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 OPENBLAS_NUM_THREADS=1 \\
        python -m training.train_copying            # writes models/qwen2-vl-copying/

Not run in CI. Fresh weights (seeded) of models/qwen2-vl-tiny's architecture, config, tokenizer
and chat template, so `mlx_vlm.load` reads it unchanged. It is the benchmark's copying workload
(bench/speculative.py): a model whose answers really repeat its prompt, so prompt lookup has real
acceptance instead of a random model's loops. Text only: each step is BATCH conversations
(default system prompt, the case's prompt as the user turn) rendered with the chat template; the
loss is the cross-entropy of the answer tokens and `<|im_end|>`.

Status (issue 21): not committed yet. On this 2-core machine under load (~2-5 s/step), 700 steps
(batch 8, lr 3e-3) and 900 more from there (lr 2e-3) left the answer loss at ~1.0 and no row
exactly right: the 3-layer, 128-wide fixture had not learnt to copy (no induction yet). Next
things to try: more steps, a longer warm-up, or a wider model (the fixture family builder).
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.nn as nn
import mlx.optimizers as optim
import numpy as np
from mlx.nn.utils import value_and_grad

from training.copying import CopyCase, copy_case
from training.train_squares import FIXTURE_DIR, fresh_model, save_model

REPO_ROOT = Path(__file__).resolve().parent.parent
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
    tokenizer: Any, rng: random.Random, rows: int
) -> tuple[mx.array, mx.array, mx.array, mx.array]:
    """(inputs [rows, L] right-padded, flat positions whose next token is an answer token [K],
    those tokens [K], their rows [K])."""
    encoded = [encode(tokenizer, copy_case(rng)) for _ in range(rows)]
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
    return language_model.model.embed_tokens.as_linear(selected)


def loss_fn(model: Any, inputs: mx.array, index: mx.array, targets: mx.array, owners: mx.array) -> mx.array:
    losses = nn.losses.cross_entropy(_answer_logits(model, inputs, index), targets, reduction="none")
    return losses.mean()


def exact_match(model: Any, inputs: mx.array, index: mx.array, targets: mx.array, owners: mx.array) -> float:
    """Share of rows whose every answer token is the argmax (teacher-forced = greedy is right)."""
    wrong = (mx.argmax(_answer_logits(model, inputs, index), axis=-1) != targets).astype(mx.float32)
    rows = int(inputs.shape[0])
    wrong_per_row = mx.zeros((rows,)).at[owners].add(wrong)
    return float((wrong_per_row == 0).astype(mx.float32).mean().item())


def train(args: argparse.Namespace) -> None:
    model, processor = fresh_model(args.fixture, args.seed, args.init)
    tokenizer = processor.tokenizer if hasattr(processor, "tokenizer") else processor
    data_rng = random.Random(args.seed)
    warmup = min(args.warmup, args.steps // 10)
    schedule = optim.join_schedules(
        [
            optim.linear_schedule(args.lr / 100, args.lr, warmup),
            optim.cosine_decay(args.lr, args.steps - warmup, args.lr / 100),
        ],
        [warmup],
    )
    optimizer = optim.AdamW(learning_rate=schedule, weight_decay=args.weight_decay)
    loss_and_grad = value_and_grad(model, loss_fn)
    clip_grad_norm: Any = optim.clip_grad_norm  # untyped in mlx
    held_out = make_batch(tokenizer, random.Random(args.eval_seed), args.eval_rows)
    history: list[dict[str, Any]] = []
    losses: list[float] = []
    started = time.time()
    for step in range(1, args.steps + 1):
        loss, grads = loss_and_grad(model, *make_batch(tokenizer, data_rng, args.batch))
        grads, _ = clip_grad_norm(grads, args.clip)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state, loss)
        losses.append(loss.item())
        if step % args.log_every == 0:
            elapsed = time.time() - started
            print(
                f"step {step} loss {np.mean(losses[-args.log_every :]):.4f} "
                f"{elapsed / step:.2f}s/step {elapsed / 60:.1f}min",
                flush=True,
            )
        if step % args.eval_every == 0 or step == args.steps:
            accuracy = exact_match(model, *held_out)
            history.append(
                {"step": step, "minutes": round((time.time() - started) / 60, 2), "exact": accuracy}
            )
            print(f"eval step {step}: exact {accuracy:.2f}", flush=True)
            save_model(model, args.out, args.fixture, _card(args, step, time.time() - started, history))
    print(f"saved {args.out} after {(time.time() - started) / 60:.1f} min", flush=True)


def _card(
    args: argparse.Namespace, step: int, elapsed: float, history: list[dict[str, Any]]
) -> dict[str, Any]:
    return {
        "task": "copying: return the JSON object / code block of the prompt with one field or line changed",
        "architecture": "qwen2_vl with the sizes of models/qwen2-vl-tiny (training/make_fixture_model.py)",
        "script": "python -m training.train_copying",
        "seed": args.seed,
        "init": str(args.init) if args.init else None,
        "steps": step,
        "planned_steps": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "seconds": round(elapsed),
        "seconds_per_step": round(elapsed / max(step, 1), 3),
        "eval_seed": args.eval_seed,
        "teacher_forced_exact_match": history[-1]["exact"] if history else None,
        "eval_history": history,
    }


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="Train the copying model.", allow_abbrev=False)
    parser.add_argument("--fixture", type=Path, default=FIXTURE_DIR)
    parser.add_argument("--out", type=Path, default=OUTPUT_DIR)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", type=Path, default=None, help="start from this model dir's weights")
    parser.add_argument("--steps", type=int, default=1500)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--eval-seed", type=int, default=424_242)
    parser.add_argument("--eval-rows", type=int, default=32)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    train(parse_args(argv))


if __name__ == "__main__":
    main()
