"""What every fixture-training script shares: the fixture's architecture with fresh weights, the
optimiser and its schedule, the step loop (clip, update, log, evaluate, checkpoint) and saving
the model as a drop-in copy of the fixture (training/train_squares.py, training/train_copying.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import mlx.core as mx
import mlx.optimizers as optim
import numpy as np
from mlx.nn.utils import value_and_grad
from mlx.utils import tree_flatten, tree_map
from tqdm import tqdm

REPO_ROOT = Path(__file__).resolve().parent.parent
FIXTURE_DIR = REPO_ROOT / "models" / "qwen2-vl-tiny"
WEIGHTS_FILE = "model.safetensors"


def resized_config(config: Any, overrides: dict[str, Any]) -> Any:
    """The fixture's ModelConfig with text-model fields of config.json replaced (`rope_theta`,
    `hidden_size`, ...); the vision merger's output width follows `hidden_size`."""
    if not overrides:
        return config
    text = dataclasses.replace(config.text_config, **overrides)
    vision = config.vision_config
    if "hidden_size" in overrides:
        vision = dataclasses.replace(vision, hidden_size=overrides["hidden_size"])
    return dataclasses.replace(config, text_config=text, vision_config=vision)


def resized_config_json(fixture_dir: Path, overrides: dict[str, Any]) -> dict[str, Any]:
    """The fixture's config.json with the same replacements as `resized_config`."""
    config: dict[str, Any] = json.loads((fixture_dir / "config.json").read_text(encoding="utf-8"))
    config.update(overrides)
    if "num_hidden_layers" in overrides:
        config["max_window_layers"] = overrides["num_hidden_layers"]
    if "hidden_size" in overrides:
        config["vision_config"]["hidden_size"] = overrides["hidden_size"]
    return config


def fresh_model(
    fixture_dir: Path, seed: int, init: Path | None = None, overrides: dict[str, Any] | None = None
) -> tuple[Any, Any]:
    """The fixture's architecture (resized by `overrides`, config.json keys) in float32, freshly
    initialised (or `init`'s weights), and its processor."""
    from mlx_vlm.models.qwen2_vl.qwen2_vl import Model
    from mlx_vlm.utils import load

    fixture, processor = load(str(fixture_dir))
    mx.random.seed(seed)
    model = Model(resized_config(fixture.config, overrides or {}))
    if init is not None:  # continue an earlier run
        model.load_weights(str(init / WEIGHTS_FILE))
    model.update(tree_map(lambda p: p.astype(mx.float32), model.parameters()))
    mx.eval(model.parameters())
    return model, processor


def save_model(
    model: Any,
    out_dir: Path,
    fixture_dir: Path,
    card: dict[str, Any],
    overrides: dict[str, Any] | None = None,
) -> int:
    """Weights as float16 plus the fixture's config (resized by `overrides`), tokenizer and
    processor files; returns bytes."""
    out_dir.mkdir(parents=True, exist_ok=True)
    for source in sorted(fixture_dir.iterdir()):
        if source.is_file() and source.name != WEIGHTS_FILE and not source.name.startswith("."):
            shutil.copy2(source, out_dir / source.name)
    if overrides:
        config = resized_config_json(fixture_dir, overrides)
        (out_dir / "config.json").write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
    parameters: Any = tree_flatten(model.parameters())
    weights = {name: value.astype(mx.float16) for name, value in parameters}
    mx.save_safetensors(str(out_dir / WEIGHTS_FILE), weights, metadata={"format": "mlx"})
    (out_dir / "training.json").write_text(json.dumps(card, indent=2) + "\n", encoding="utf-8")
    return sum(path.stat().st_size for path in out_dir.iterdir() if path.is_file())


def add_loop_arguments(
    parser: argparse.ArgumentParser, *, out: Path, steps: int, batch: int, lr: float, eval_seed: int
) -> None:
    """The flags every training script has (the defaults that differ are the script's)."""
    parser.add_argument("--fixture", type=Path, default=FIXTURE_DIR)
    parser.add_argument("--out", type=Path, default=out)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--init", type=Path, default=None, help="start from this model dir's weights")
    parser.add_argument("--steps", type=int, default=steps)
    parser.add_argument("--batch", type=int, default=batch)
    parser.add_argument("--lr", type=float, default=lr)
    parser.add_argument("--warmup", type=int, default=100)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--log-every", type=int, default=25)
    parser.add_argument("--eval-every", type=int, default=250)
    parser.add_argument("--eval-seed", type=int, default=eval_seed)
    parser.add_argument("--eval-rows", type=int, default=32)


@dataclass(frozen=True)
class Task:
    """What a script plugs into the loop. `loss(model, *batch)` is differentiated; `batch(step)`
    draws step's training batch; `evaluate()` scores held-out data (name -> share right);
    `card(step, seconds, history)` is the training.json written beside every checkpoint."""

    loss: Callable[..., mx.array]
    batch: Callable[[int], Sequence[Any]]
    evaluate: Callable[[], dict[str, float]]
    card: Callable[[int, float, list[dict[str, Any]]], dict[str, Any]]
    # The optimiser for these args (default: `optimizer_for`), e.g. other rates for some weights.
    optimizer: Callable[[argparse.Namespace], optim.Optimizer] | None = None


def optimizer_for(args: argparse.Namespace) -> optim.Optimizer:
    """AdamW, linear warm-up to --lr then cosine decay to --lr / 100."""
    warmup = min(args.warmup, args.steps // 10)
    schedule = optim.join_schedules(
        [
            optim.linear_schedule(args.lr / 100, args.lr, warmup),
            optim.cosine_decay(args.lr, args.steps - warmup, args.lr / 100),
        ],
        [warmup],
    )
    return optim.AdamW(learning_rate=schedule, weight_decay=args.weight_decay)


def format_accuracy(accuracy: dict[str, float]) -> str:
    return " ".join(f"{name}={value:.2f}" for name, value in sorted(accuracy.items()))


def train_loop(model: Any, task: Task, args: argparse.Namespace) -> list[dict[str, Any]]:
    """--steps optimiser steps; every --eval-every an evaluation and a checkpoint in --out (so a
    stopped run still leaves a model), the last one the final model. Returns the eval history."""
    optimizer = (task.optimizer or optimizer_for)(args)
    # A MultiOptimizer's rates are its parts'; the last one's is the base rate.
    base_optimizer = getattr(optimizer, "optimizers", [optimizer])[-1]
    loss_and_grad = value_and_grad(model, task.loss)
    clip_grad_norm: Any = optim.clip_grad_norm  # untyped in mlx
    started = time.time()
    history: list[dict[str, Any]] = []
    losses: list[float] = []
    # A bar on a terminal (none in logs: disable=None); the step lines go through it.
    bar = tqdm(total=args.steps, desc="training", unit="step", disable=None, dynamic_ncols=True)
    for step in range(1, args.steps + 1):
        bar.update(1)
        loss, grads = loss_and_grad(model, *task.batch(step))
        grads, _ = clip_grad_norm(grads, args.clip)
        optimizer.update(model, grads)
        mx.eval(model.parameters(), optimizer.state, loss)
        losses.append(loss.item())
        if step % args.log_every == 0:
            elapsed = time.time() - started
            bar.set_postfix(loss=f"{np.mean(losses[-args.log_every :]):.4f}", refresh=False)
            tqdm.write(
                f"step {step} loss {np.mean(losses[-args.log_every :]):.4f} "
                f"lr {base_optimizer.learning_rate.item():.2e} "
                f"{elapsed / step:.2f}s/step {elapsed / 60:.1f}min"
            )
        if step % args.eval_every == 0 or step == args.steps:
            accuracy = task.evaluate()
            history.append(
                {"step": step, "minutes": round((time.time() - started) / 60, 2), "accuracy": accuracy}
            )
            tqdm.write(f"eval step {step}: {format_accuracy(accuracy)}")
            card = task.card(step, time.time() - started, history)
            size = save_model(model, args.out, args.fixture, card, getattr(args, "overrides", None))
    bar.close()
    print(f"saved {args.out} ({size / 1e6:.2f} MB) after {(time.time() - started) / 60:.1f} min", flush=True)
    return history


def base_card(
    args: argparse.Namespace, step: int, elapsed: float, history: list[dict[str, Any]]
) -> dict[str, Any]:
    """The run details every training.json has."""
    return {
        "architecture": "qwen2_vl with the sizes of models/qwen2-vl-tiny (training/make_fixture_model.py)",
        "seed": args.seed,
        "init": str(args.init) if args.init else None,
        "steps": step,
        "planned_steps": args.steps,
        "batch": args.batch,
        "lr": args.lr,
        "seconds": round(elapsed),
        "seconds_per_step": round(elapsed / max(step, 1), 3),
        "eval_seed": args.eval_seed,
        "teacher_forced_accuracy": history[-1]["accuracy"] if history else {},
        "eval_history": history,
    }
