"""What choosing a step's tokens costs (issue 37.2, "say where the rest goes: sampling"), two parts:

- `choice`: the tokens of R rows from logits [R, vocab], the engine's batched choice
  (vlmserve/engine/token_choice.py) against the per-row pipeline it replaced (mlx-vlm's
  `make_sampler` order, one graph per row: log-softmax, `apply_top_p`'s sort, `apply_top_k`, a
  Gumbel draw with the row's key), alternating, at real vocabulary sizes (Qwen2-VL's 152,064,
  Qwen3.5's 248,320) and the bench model's 8,192, for Qwen's sampling defaults (temperature 0.7,
  top_p 0.8, top_k 20), top_p alone and greedy;
- `decode`: the engine (in-process generation loop, speculation off) serving C concurrent
  requests, each with a prompt of its own, once greedy and once sampled with Qwen's defaults,
  alternating: what sampled traffic costs beside greedy traffic (tokens per wall second).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m bench.token_choice [--part choice decode] [--rows 1 8 16]
            [--vocab 8192 152064 248320] [--model DIR] [--rounds 5]
            [--out bench/results/token-choice.json]
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from bench.bench_model import DEFAULT_DIR, build_bench_model

QWEN = {"temperature": 0.7, "top_p": 0.8, "top_k": 20}
SETTINGS = {
    "qwen-defaults": QWEN,
    "top-p-only": {"temperature": 1.0, "top_p": 0.9, "top_k": 0},
    "greedy": {"temperature": 0.0, "top_p": 1.0, "top_k": 0},
}


def per_row(logits: Any, keys: list[Any], settings: dict[str, Any]) -> Any:
    """The pipeline the engine ran before token_choice.py: each row its own graph."""
    import mlx.core as mx
    from mlx_vlm.sample_utils import apply_top_k, apply_top_p

    tokens = []
    for index in range(logits.shape[0]):
        row = logits[index : index + 1]
        if settings["temperature"] == 0:
            tokens.append(mx.argmax(row, axis=-1))
            continue
        logprobs = row - mx.logsumexp(row, axis=-1, keepdims=True)
        if 0 < settings["top_p"] < 1:
            logprobs = apply_top_p(logprobs, settings["top_p"])
        if 0 < settings["top_k"] < logprobs.shape[-1]:
            logprobs = apply_top_k(logprobs, settings["top_k"])
        keys[index], step_key = mx.random.split(keys[index])
        tokens.append(mx.random.categorical(logprobs * (1 / settings["temperature"]), key=step_key))
    return mx.concatenate(tokens)


def batched(logits: Any, samplers: list[Any]) -> Any:
    from vlmserve.engine.token_choice import choose_tokens

    return choose_tokens(logits, samplers)


def _timed(step: Callable[[], Any], repeats: int) -> float:
    import mlx.core as mx

    start = time.perf_counter()
    for _ in range(repeats):
        mx.eval(step())
    return (time.perf_counter() - start) / repeats


def choice_part(rows_list: Sequence[int], vocabs: Sequence[int], rounds: int) -> list[dict[str, Any]]:
    import mlx.core as mx

    from vlmserve.engine.sampling import SamplingSettings, TokenSampler

    cells = []
    for vocab in vocabs:
        for rows in rows_list:
            logits = mx.random.normal((rows, vocab), key=mx.random.key(vocab + rows)) * 3
            mx.eval(logits)
            for name, settings in SETTINGS.items():
                keys = [mx.random.key(index) for index in range(rows)]
                samplers = [
                    TokenSampler(SamplingSettings(max_tokens=1, seed=index, **settings), SimpleNamespace())
                    for index in range(rows)
                ]
                repeats = max(3, int(2e6 // (rows * vocab)))
                before, after = [], []
                for round_index in range(rounds):
                    pair = [
                        ("before", functools.partial(per_row, logits, keys, settings)),
                        ("after", functools.partial(batched, logits, samplers)),
                    ]
                    for label, step in pair if round_index % 2 == 0 else pair[::-1]:
                        (before if label == "before" else after).append(_timed(step, repeats))
                cell = {
                    "vocab": vocab,
                    "rows": rows,
                    "settings": name,
                    "before_ms": statistics.median(before) * 1e3,
                    "after_ms": statistics.median(after) * 1e3,
                }
                cell["speedup"] = cell["before_ms"] / cell["after_ms"]
                _keep(
                    cells,
                    cell,
                    f"vocab {vocab:>6}  rows {rows:>2}  {name:<13}  per-row {cell['before_ms']:8.2f} ms"
                    f"  batched {cell['after_ms']:7.2f} ms  {cell['speedup']:5.2f}x",
                )
    return cells


def decode_part(model: str, concurrency: Sequence[int], rounds: int, max_tokens: int) -> list[dict[str, Any]]:
    from bench.speculative import run, start

    generator = start(model, "off", max_tokens)
    cells = []
    try:
        for count in concurrency:
            sides: dict[str, list[float]] = {"greedy": [], "qwen-defaults": []}
            for round_index in range(rounds + 1):
                order = list(sides) if round_index % 2 == 0 else list(sides)[::-1]
                for name in order:
                    settings = SETTINGS[name]
                    requests = [
                        _request(
                            generator,
                            f"Request {round_index}-{index}: " + " ".join(str(index * j) for j in range(12)),
                            index,
                            max_tokens,
                            settings,
                        )
                        for index in range(count)
                    ]
                    result = run(generator, requests, f"{name}-{count}-{round_index}")
                    if round_index:  # the first round warms the shapes up
                        sides[name].append(result["tokens"] / result["wall_s"])
            cell = {
                "concurrency": count,
                **{f"{name}_tok_s": statistics.median(v) for name, v in sides.items()},
            }
            cell["sampled_over_greedy"] = cell["qwen-defaults_tok_s"] / cell["greedy_tok_s"]
            _keep(
                cells,
                cell,
                f"{count:>2} streams  greedy {cell['greedy_tok_s']:7.1f} tok/s  sampled (Qwen defaults) "
                f"{cell['qwen-defaults_tok_s']:7.1f} tok/s  {cell['sampled_over_greedy']:.3f}x",
            )
    finally:
        generator.stop()
    return cells


def _keep(cells: list[dict[str, Any]], cell: dict[str, Any], line: str) -> None:
    """A measured cell, kept and printed as it comes."""
    cells.append(cell)
    print(line, flush=True)


def _request(generator: Any, text: str, seed: int, max_tokens: int, settings: dict[str, Any]) -> Any:
    """A request with its own prompt and the sampling fields a client sends."""
    from vlmserve.engine.jobs import JobKind
    from vlmserve.engine.v1 import engine_pb2 as pb

    sampling = pb.SamplingParams(max_tokens=max_tokens, temperature=settings["temperature"], seed=seed)
    if settings["temperature"]:
        sampling.top_p = settings["top_p"]
        sampling.top_k = settings["top_k"]
    return generator.preparer.prepare(
        pb.GenerateRequest(
            messages=[pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text=text))])],
            sampling=sampling,
        ),
        kind=JobKind.GENERATE,
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--part", nargs="+", choices=("choice", "decode"), default=["choice", "decode"])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 8, 16])
    parser.add_argument("--vocab", nargs="+", type=int, default=[8192, 152064, 248320])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 8, 16])
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=Path("bench/results/token-choice.json"))
    args = parser.parse_args(argv)
    results: dict[str, Any] = {}
    if "choice" in args.part:
        results["choice"] = choice_part(args.rows, args.vocab, args.rounds)
    if "decode" in args.part:
        model = str(args.model or build_bench_model(DEFAULT_DIR)[0])
        results["decode"] = {
            "model": model,
            "cells": decode_part(model, args.concurrency, args.rounds, args.max_tokens),
        }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
