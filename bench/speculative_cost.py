"""Speculation never costs (issue 37.1): `--speculative MODE` ÷ `off` at concurrency 1, 2, 4, 8
and 16, side by side in one process, alternating, on one model.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m bench.speculative_cost [--model DIR] [--speculative lookup|draft|auto]
            [--draft-model DIR] [--workloads nothing greedy copy] [--concurrency 1 2 4 8 16]
            [--rounds 5] [--max-tokens 64] [--seconds 3] [--baseline off|per-row-drafter]
            [--out bench/results/speculative_cost.json]

Two in-process engines (bench/speculative.py's `start`: the generation loop, no gRPC) on the same
weights. A cell (a workload at a concurrency) is a number of waves, each `concurrency` requests
submitted together, each request with a prompt of its own (the same prompts on both engines and
in every round): enough waves that the cell lasts `--seconds` on `off` (measured once, on a first
wave that both engines run as their warm-up of that shape), so one preemption of the shared
machine is a small part of it. Each round runs every cell on one engine then the other, back to
back (the order flips every round and every cell). Workloads:

- nothing: temperature 1, its own seed (random text on a random model: nothing to copy, so
  speculation can only cost: the policy must fall back to plain steps);
- greedy: temperature 0 (a random model's greedy text loops, which lookup and the fixtures'
  drafters predict: what speculation gains);
- copy: held-out cases of training/copying.py (for models/qwen2-vl-copying: return a JSON object
  or a function with one field or line changed, greedy).

Per cell: tokens per wall second of each engine (summed over the rounds); each round's pair
ratio (the mode's tokens per wall second ÷ `off`'s, back to back): their median (the table's
figure), lowest and highest (the spread), and the same for process CPU time; drafts accepted /
drafted, verify and plain forwards, the step gate's trials (exploration and probes: verify
steps taken to measure, not because drafting was expected to pay) and its decisions, the
drafter model's forwards (a DFlash drafter counts them) and the share of wall spent in its
`propose`, and whether every request took the same tokens on both engines in every round. The
load average is recorded beside each cell (the machine is shared: the ratios of a cell move with
it). Default model: the 144M random bench model (bench/bench_model.py).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.bench_model import DEFAULT_DIR, build_bench_model
from bench.speculative import COUNTERS, numbered_requests, request, run, start, summarise
from training.copying import copy_case
from vlmserve.engine.jobs import PreparedRequest
from vlmserve.engine.loop.generator import Generator

WORKLOADS = ("nothing", "greedy", "copy")
# Waves a cell may take (a model so fast that `--seconds` would need more is measured on fewer).
MAX_WAVES = 64


def requests(
    generator: Generator, workload: str, count: int, max_tokens: int, first: int = 0
) -> list[PreparedRequest]:
    """`count` requests of `workload`, each with a prompt of its own (numbered from `first`)."""
    numbers = range(first, first + count)
    if workload == "nothing":
        return [
            request(generator, f"Tell me story {i}.", temperature=1.0, seed=i, max_tokens=max_tokens)
            for i in numbers
        ]
    if workload == "greedy":
        return numbered_requests(generator, count, max_tokens, first)
    cases = [copy_case(random.Random(900_000 + i)).prompt for i in numbers]
    return [
        request(generator, text, temperature=0.0, seed=i, max_tokens=max_tokens)
        for i, text in zip(numbers, cases, strict=True)
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


def gate_counts(generator: Generator) -> dict[str, int]:
    """The step gate's decisions so far, counted in the returned dict (kept up to date): steps
    it decided, verified, and verified as trials (exploration or probes: step_cost.py)."""
    counts = {"gate_steps": 0, "gate_verifies": 0, "gate_trials": 0}
    runner = generator._runner
    verifier = runner.batch.verifier if runner is not None else None
    gate = verifier.speculator.gate if verifier is not None else None
    if gate is None:
        return counts
    decide = gate.verifies

    def counted(*args: Any, **kwargs: Any) -> bool:
        verifies: bool = decide(*args, **kwargs)
        counts["gate_steps"] += 1
        counts["gate_verifies"] += int(verifies)
        counts["gate_trials"] += int(verifies and gate.trial)
        return verifies

    gate.verifies = counted  # type: ignore[method-assign]
    return counts


def cell_run(
    generator: Generator,
    waves: Sequence[list[PreparedRequest]],
    tag: str,
    drafting: list[float],
    gate: dict[str, int],
) -> dict[str, Any]:
    """The cell's waves one after another (bench/speculative.py's `run` each), summed, with the
    drafter model's forwards and seconds and the step gate's decisions."""
    before, seconds, decided = drafter_forwards(generator), drafting[0], dict(gate)
    keys = ("wall_s", "cpu_s", "tokens", *COUNTERS, "verify_forwards", "plain_forwards")
    result: dict[str, Any] = dict.fromkeys(keys, 0.0)
    result["token_ids"] = []
    for index, batch in enumerate(waves):
        wave: dict[str, Any] = run(generator, batch, f"{tag}-w{index}")
        for key in keys:
            result[key] += wave[key]
        result["token_ids"].extend(wave["token_ids"])
    after = drafter_forwards(generator)
    result["drafter_forwards"] = after - before if after is not None and before is not None else None
    result["drafter_s"] = drafting[0] - seconds
    result.update({key: gate[key] - decided[key] for key in gate})
    return result


def spread(values: Sequence[float]) -> dict[str, float]:
    """The median, lowest and highest of a cell's pair ratios."""
    ordered = sorted(values)
    middle = len(ordered) // 2
    median = ordered[middle] if len(ordered) % 2 else (ordered[middle - 1] + ordered[middle]) / 2
    return {"median": median, "low": ordered[0], "high": ordered[-1]}


def code_commit() -> str:
    """The checkout's commit (and whether it has changes), for the results."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True
        )
        return commit + ("+changes" if dirty.stdout.strip() else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0], allow_abbrev=False)
    parser.add_argument("--model", type=Path, default=None)
    parser.add_argument("--speculative", choices=("lookup", "draft", "auto"), default="lookup")
    parser.add_argument("--draft-model", default=None, help="drafter for --speculative draft|auto")
    parser.add_argument("--workloads", nargs="+", choices=WORKLOADS, default=["nothing", "greedy"])
    parser.add_argument("--concurrency", nargs="+", type=int, default=[1, 2, 4, 8, 16])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument(
        "--seconds", type=float, default=3.0, help="what a cell lasts on `off` (waves of requests)"
    )
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
    gates = {name: gate_counts(generator) for name, generator in engines.items()}
    started, code = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), code_commit()
    # Each cell's waves: its first is both engines' warm-up of that shape and measures how many
    # the cell needs to last `--seconds` on `off`.
    plans: dict[tuple[str, int], list[list[PreparedRequest]]] = {}
    for workload in args.workloads:
        for count in args.concurrency:
            first = requests(engines["off"], workload, count, args.max_tokens)
            for name in engines:
                run(engines[name], first, f"warm-{workload}-{count}-{name}")
            # Timed again, warm (a first run of a shape, or one preempted, lasts several times longer).
            seconds = min(
                run(engines["off"], first, f"time-{workload}-{count}-{i}")["wall_s"] for i in range(2)
            )
            waves = max(1, min(MAX_WAVES, math.ceil(args.seconds / seconds)))
            plans[(workload, count)] = [
                requests(engines["off"], workload, count, args.max_tokens, wave * count)
                for wave in range(waves)
            ]
            print(f"{workload} x{count}: {waves} waves ({seconds:.2f} s each on off)", flush=True)
    cells: dict[tuple[str, int], dict[str, list[dict[str, Any]]]] = {}
    loads: dict[tuple[str, int], list[float]] = {}
    for round_index in range(args.rounds):
        for step, (key, waves) in enumerate(plans.items()):
            workload, count = key
            order = list(engines) if (round_index + step) % 2 == 0 else list(reversed(engines))
            cell = cells.setdefault(key, {name: [] for name in engines})
            loads.setdefault(key, []).append(os.getloadavg()[0])
            for name in order:
                tag = f"{workload}-{count}-{name}-{round_index}"
                cell[name].append(cell_run(engines[name], waves, tag, drafting[name], gates[name]))
            off, on = cell["off"][-1], cell[mode][-1]
            rates = off["tokens"] / off["wall_s"], on["tokens"] / on["wall_s"]
            print(
                f"round {round_index} {workload} x{count}: off {rates[0]:.1f} tok/s, "
                f"{mode} {rates[1]:.1f} tok/s ({rates[1] / rates[0]:.3f}x; {off['wall_s']:.1f} s), "
                f"verify/plain {on['verify_forwards']:.0f}/{on['plain_forwards']:.0f}, "
                f"trials {on['gate_trials']}, load {os.getloadavg()[0]:.1f}",
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
        "seconds": args.seconds,
        "started": started,
        "code": code,
        "cells": [],
    }
    for (workload, count), cell in cells.items():
        off, on = summarise(cell["off"]), summarise(cell[mode])
        # Each round's pair ran back to back: the median of the pairs' ratios is the least
        # disturbed by the machine's other work (a pair preempted unevenly is one of several).
        paired = list(zip(cell["off"], cell[mode], strict=True))
        wall = spread([b["tokens"] / b["wall_s"] / (a["tokens"] / a["wall_s"]) for a, b in paired])
        cpu = spread([b["tokens"] / b["cpu_s"] / (a["tokens"] / a["cpu_s"]) for a, b in paired])
        drafter = [r["drafter_forwards"] for r in cell[mode]]
        same = all(a["token_ids"] == b["token_ids"] for a, b in paired)
        results["cells"].append(
            {
                "workload": workload,
                "concurrency": count,
                "waves": len(plans[(workload, count)]),
                "requests": count * len(plans[(workload, count)]),
                "off_wall_s_per_round": off["wall_s"] / len(cell["off"]),
                "off_tok_per_s": off["tok_per_s"],
                "on_tok_per_s": on["tok_per_s"],
                "ratio_wall": on["tok_per_s"] / off["tok_per_s"],
                "ratio_cpu": on["tok_per_cpu_s"] / off["tok_per_cpu_s"],
                "median_pair_ratio_wall": wall["median"],
                "low_pair_ratio_wall": wall["low"],
                "high_pair_ratio_wall": wall["high"],
                "median_pair_ratio_cpu": cpu["median"],
                "low_pair_ratio_cpu": cpu["low"],
                "high_pair_ratio_cpu": cpu["high"],
                "pair_ratios_wall": sorted(
                    b["tokens"] / b["wall_s"] / (a["tokens"] / a["wall_s"]) for a, b in paired
                ),
                "tokens": on["tokens"],
                "drafted": on["speculative_drafted_tokens"],
                "accepted": on["speculative_accepted_tokens"],
                "verify_forwards": on["verify_forwards"],
                "plain_forwards": on["plain_forwards"],
                "gate_steps": sum(r["gate_steps"] for r in cell[mode]),
                "gate_verifies": sum(r["gate_verifies"] for r in cell[mode]),
                "gate_trials": sum(r["gate_trials"] for r in cell[mode]),
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
    """The runs' cells as table rows: mode, workload, concurrency, tok/s, ratios with their
    spread, drafts, forwards, the gate's trials."""
    lines = [
        "| mode (model) | workload | streams | s per cell | off tok/s | on tok/s "
        "| ÷ off (wall: median pair, lowest-highest) | CPU | accepted / drafted "
        "| verify / plain forwards (trials) | drafter forwards (share of wall) | same tokens | load |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for result in runs:
        for cell in result["cells"]:
            wall = ratio_text(cell, "wall")
            lines.append(
                f"| {result['label']} | {cell['workload']} | {cell['concurrency']} "
                f"| {cell.get('off_wall_s_per_round', float('nan')):.1f} "
                f"| {cell['off_tok_per_s']:.1f} | {cell['on_tok_per_s']:.1f} "
                f"| {wall} | {cell['median_pair_ratio_cpu']:.2f}× "
                f"| {cell['accepted']:.0f} / {cell['drafted']:.0f} "
                f"| {cell['verify_forwards']:.0f} / {cell['plain_forwards']:.0f} "
                f"({cell.get('gate_trials', '?')}) "
                f"| {drafter_column(cell)} "
                f"| {'yes' if cell['same_tokens'] else 'NO'} | {cell['load_average']:.1f} |"
            )
    return "\n".join(lines)


def ratio_text(cell: dict[str, Any], kind: str) -> str:
    """A cell's median pair ratio with its lowest and highest pair."""
    median = cell[f"median_pair_ratio_{kind}"]
    low, high = cell.get(f"low_pair_ratio_{kind}"), cell.get(f"high_pair_ratio_{kind}")
    return f"{median:.3f}×" if low is None or high is None else f"{median:.3f}× ({low:.2f}-{high:.2f})"


def drafter_column(cell: dict[str, Any]) -> str:
    """The drafter's forwards (the baseline's too, when it counts them) and its share of wall."""
    forwards = cell.get("drafter_forwards")
    if forwards is None:
        return "—"
    baseline = cell.get("baseline_drafter_forwards")
    text = f"{forwards}" if baseline is None else f"{forwards} (baseline {baseline})"
    share = cell.get("drafter_share_of_wall")
    return text if share is None else f"{text}, {100 * share:.0f} %"


def table(paths: Sequence[Path]) -> None:
    """Print the table of result files (`python -m bench.speculative_cost --table FILE...`)."""
    print(markdown([json.loads(path.read_text()) for path in paths]))


if __name__ == "__main__":
    import sys

    if sys.argv[1:2] == ["--table"]:
        table([Path(path) for path in sys.argv[2:]])
    else:
        main()
