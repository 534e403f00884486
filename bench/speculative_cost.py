"""Speculation never costs (issue 37.1): `--speculative MODE` ÷ `off` at concurrency 1, 2, 4, 8
and 16, side by side in one process, alternating, on one model.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m bench.speculative_cost [--model DIR] [--speculative lookup|draft|auto]
            [--draft-model DIR] [--workloads nothing greedy copy] [--concurrency 1 2 4 8 16]
            [--rounds 2] [--max-tokens 32] [--baseline off|per-row-drafter]
            [--out bench/results/speculative_cost.json]

Two in-process engines (bench/speculative.py's `start`: the generation loop, no gRPC) on the same
weights; each round runs every workload at every concurrency on one engine then the other (the
order flips every round and every concurrency). Workloads, each request with a prompt of its own:

- nothing: temperature 1, its own seed (random text on a random model: nothing to copy, so
  speculation can only cost: the policy must fall back to plain steps);
- greedy: temperature 0 (a random model's greedy text loops, which lookup and the fixtures'
  drafters predict: what speculation gains);
- copy: held-out cases of training/copying.py (for models/qwen2-vl-copying: return a JSON object
  or a function with one field or line changed, greedy).

Per cell: tokens per wall second of each engine (summed over the rounds), the median over the
rounds of each back-to-back pair's ratio (wall and process CPU time; the table's figures),
drafts accepted / drafted, verify and plain forwards, the drafter model's forwards (a DFlash
drafter counts them: one per step however many rows draft, dflash_batch.py), and whether every
request took the same tokens. The load average is recorded beside each cell (the machine is
shared: the ratios of a cell move with it). Default model: the 144M random bench model (bench/bench_model.py).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.bench_model import DEFAULT_DIR, build_bench_model
from bench.speculative import numbered_requests, request, run, start, summarise
from training.copying import copy_case
from vlmserve.engine.jobs import PreparedRequest
from vlmserve.engine.loop.generator import Generator

WORKLOADS = ("nothing", "greedy", "copy")


def requests(generator: Generator, workload: str, count: int, max_tokens: int) -> list[PreparedRequest]:
    """`count` requests of `workload`, each with a prompt of its own."""
    if workload == "nothing":
        return [
            request(generator, f"Tell me story {i}.", temperature=1.0, seed=i, max_tokens=max_tokens)
            for i in range(count)
        ]
    if workload == "greedy":
        return numbered_requests(generator, count, max_tokens)
    cases = [copy_case(random.Random(900_000 + i)).prompt for i in range(count)]
    return [
        request(generator, text, temperature=0.0, seed=i, max_tokens=max_tokens)
        for i, text in enumerate(cases)
    ]


def model_drafter(generator: Generator) -> Any:
    """The engine's drafter model (None: none)."""
    runner = generator._runner
    verifier = runner.batch.verifier if runner is not None else None
    return verifier.model_drafter if verifier is not None else None


def drafter_forwards(generator: Generator) -> int | None:
    """The drafter model's forwards so far (None: no drafter that counts them)."""
    forwards = getattr(model_drafter(generator), "forwards", None)
    return forwards if isinstance(forwards, int) else None


def timed_drafts(generator: Generator) -> list[float]:
    """Seconds the engine's drafter model spends proposing drafts, summed in the returned
    list's one item (its forwards, built and evaluated: what overlapping them with the
    target's forward could save at most)."""
    drafter = model_drafter(generator)
    spent = [0.0]
    if drafter is None:
        return spent
    propose = drafter.propose

    def timed(rows: Any, counts: Any) -> list[list[int]]:
        started = time.perf_counter()
        try:
            drafts: list[list[int]] = propose(rows, counts)
            return drafts
        finally:
            spent[0] += time.perf_counter() - started

    drafter.propose = timed
    return spent


def counted_run(
    generator: Generator, batch: list[PreparedRequest], tag: str, drafting: list[float]
) -> dict[str, Any]:
    """bench/speculative.py's `run`, with the drafter model's forwards and seconds it took."""
    before, seconds = drafter_forwards(generator), drafting[0]
    result: dict[str, Any] = run(generator, batch, tag)
    after = drafter_forwards(generator)
    result["drafter_forwards"] = after - before if after is not None and before is not None else None
    result["drafter_s"] = drafting[0] - seconds
    return result


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0], allow_abbrev=False)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--speculative", choices=("lookup", "draft", "auto"), default="lookup")
    parser.add_argument("--draft-model", default=None, help="drafter for --speculative draft|auto")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=["nothing", "greedy"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument(
        "--baseline",
        choices=("off", "per-row-drafter"),
        default="off",
        help="what the mode is divided by: --speculative off, or the same mode with a DFlash drafter's "
        "forwards one per row (dflash_batch.py's batching off)",
    )
    parser.add_argument("--label", default=None, help="the run's name in the table (default: the mode)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/speculative_cost.json"))
    args = parser.parse_args(argv)
    model = args.model if args.model is not None else build_bench_model(DEFAULT_DIR)[0]
    mode = args.speculative
    engines = {name: start(str(model), name, args.max_tokens, args.draft_model) for name in ("off", mode)}
    if args.baseline == "per-row-drafter":  # the baseline drafts as the mode does, a forward per row
        engines["off"].stop()
        engines["off"] = start(str(model), mode, args.max_tokens, args.draft_model)
        drafter = model_drafter(engines["off"])
        if not hasattr(drafter, "_batched"):
            raise SystemExit("--baseline per-row-drafter needs a DFlash --draft-model")
        drafter._batched = False
    drafting = {name: timed_drafts(generator) for name, generator in engines.items()}
    for name, generator in engines.items():  # warm up both (first forwards of each shape)
        run(generator, requests(generator, args.workloads[0], 2, 8), f"warm-{name}")
    cells: dict[tuple[str, int], dict[str, list[dict[str, Any]]]] = {}
    loads: dict[tuple[str, int], list[float]] = {}
    for round_index in range(args.rounds):
        for workload in args.workloads:
            for step, count in enumerate(args.concurrency):
                batch = requests(engines["off"], workload, count, args.max_tokens)
                order = list(engines) if (round_index + step) % 2 == 0 else list(reversed(engines))
                cell = cells.setdefault((workload, count), {name: [] for name in engines})
                loads.setdefault((workload, count), []).append(os.getloadavg()[0])
                for name in order:
                    tag = f"{workload}-{count}-{name}-{round_index}"
                    cell[name].append(counted_run(engines[name], batch, tag, drafting[name]))
                off, on = cell["off"][-1], cell[mode][-1]
                rates = off["tokens"] / off["wall_s"], on["tokens"] / on["wall_s"]
                print(
                    f"round {round_index} {workload} x{count}: off {rates[0]:.1f} tok/s, "
                    f"{mode} {rates[1]:.1f} tok/s, load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
    results: dict[str, Any] = {
        "model": str(model),
        "speculative": mode,
        "label": args.label or mode,
        "draft_model": args.draft_model,
        "baseline": args.baseline,
        "rounds": args.rounds,
        "max_tokens": args.max_tokens,
        "cells": [],
    }
    for (workload, count), cell in cells.items():
        off, on = summarise(cell["off"]), summarise(cell[mode])
        # Each round's pair ran back to back: the median of the pairs' ratios is the least
        # disturbed by the machine's other work (a pair preempted unevenly is one of several).
        paired = list(zip(cell["off"], cell[mode], strict=True))
        pairs = sorted(b["tokens"] / b["wall_s"] / (a["tokens"] / a["wall_s"]) for a, b in paired)
        cpu_pairs = sorted(b["tokens"] / b["cpu_s"] / (a["tokens"] / a["cpu_s"]) for a, b in paired)
        drafter = [r["drafter_forwards"] for r in cell[mode]]
        same = all(a["token_ids"] == b["token_ids"] for a, b in zip(cell["off"], cell[mode], strict=True))
        results["cells"].append(
            {
                "workload": workload,
                "concurrency": count,
                "off_tok_per_s": off["tok_per_s"],
                "on_tok_per_s": on["tok_per_s"],
                "ratio_wall": on["tok_per_s"] / off["tok_per_s"],
                "ratio_cpu": on["tok_per_cpu_s"] / off["tok_per_cpu_s"],
                "median_pair_ratio_wall": pairs[len(pairs) // 2],
                "median_pair_ratio_cpu": cpu_pairs[len(cpu_pairs) // 2],
                "pair_ratios_wall": pairs,
                "drafted": on["speculative_drafted_tokens"],
                "accepted": on["speculative_accepted_tokens"],
                "verify_forwards": on["verify_forwards"],
                "plain_forwards": on["plain_forwards"],
                "drafter_forwards": None if None in drafter else sum(drafter),
                "drafter_share_of_wall": sum(r["drafter_s"] for r in cell[mode]) / on["wall_s"],
                "baseline_drafter_forwards": None
                if any(r["drafter_forwards"] is None for r in cell["off"])
                else sum(r["drafter_forwards"] for r in cell["off"]),
                "same_tokens": same,
                "load_average": sum(loads[(workload, count)]) / len(loads[(workload, count)]),
            }
        )
    for generator in engines.values():
        generator.stop()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(markdown([results]))


def markdown(runs: Sequence[dict[str, Any]]) -> str:
    """The runs' cells as table rows: mode, workload, concurrency, tok/s, ratios, drafts."""
    lines = [
        "| mode (model) | workload | streams | off tok/s | on tok/s | ÷ off (wall, median pair) | CPU "
        "| accepted / drafted | verify / plain forwards | drafter forwards (share of wall) "
        "| same tokens | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in runs:
        for cell in result["cells"]:
            lines.append(
                f"| {result['label']} | {cell['workload']} | {cell['concurrency']} "
                f"| {cell['off_tok_per_s']:.1f} | {cell['on_tok_per_s']:.1f} "
                f"| {cell['median_pair_ratio_wall']:.2f}× | {cell['median_pair_ratio_cpu']:.2f}× "
                f"| {cell['accepted']:.0f} / {cell['drafted']:.0f} "
                f"| {cell['verify_forwards']:.0f} / {cell['plain_forwards']:.0f} "
                f"| {drafter_column(cell)} "
                f"| {'yes' if cell['same_tokens'] else 'NO'} | {cell['load_average']:.1f} |"
            )
    return "\n".join(lines)


def drafter_column(cell: dict[str, Any]) -> str:
    """The drafter's forwards (the baseline's too, when it counts them) and its share of wall."""
    forwards = cell.get("drafter_forwards")
    if forwards is None:
        return "—"
    baseline = cell.get("baseline_drafter_forwards")
    text = f"{forwards}" if baseline is None else f"{forwards} (baseline {baseline})"
    share = cell.get("drafter_share_of_wall")
    return text if share is None else f"{text}, {100 * share:.0f} %"


if __name__ == "__main__":
    main()
