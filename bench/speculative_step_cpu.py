"""What a decode step costs the generation thread with `--speculative MODE` against `off` (issue
37.1: a plain step under a speculative mode must cost what `off`'s does), side by side in one
process, alternating.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m bench.speculative_step_cpu --model DIR [--speculative auto] [--draft-model DIR]
            [--workload nothing] [--concurrency 8] [--rounds 4] [--waves 4] [--out FILE.json]

Two in-process engines (bench/speculative.py's `start`) on the same weights run the same waves
of `--concurrency` requests (bench/speculative_cost.py's workloads), the order flipping every
round. Each engine's `StepRunner.run_step` is timed on the generation thread: decode steps
(a batch decoding, nothing joining or prefilling) apart from the others. Reported per decode
step: the generation thread's CPU time (`time.thread_time`: its Python and the MLX graph it
builds, whatever the machine's load) and wall time, and the verify steps among them (with the
gate closed there are a few probes). The forward itself runs on MLX's own threads: its cost is
in the wall time and the process CPU time, not the thread's.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from bench.speculative import counter, run, start
from bench.speculative_cost import WORKLOADS, requests


def timed_steps(generator: Any) -> dict[str, float]:
    """Wraps the engine's `run_step`: the returned dict sums decode steps' thread CPU and wall."""
    runner = generator._runner
    step: Callable[[Iterable[Any]], Any] = runner.run_step
    totals = {"cpu_s": 0.0, "wall_s": 0.0, "steps": 0.0}

    def timed(joined: Iterable[Any] = ()) -> Any:
        jobs = list(joined)
        decoding = len(runner.batch) > 0 and not jobs and len(runner.prompts) == 0
        cpu, wall = time.thread_time(), time.perf_counter()
        try:
            return step(jobs)
        finally:
            if decoding:
                totals["cpu_s"] += time.thread_time() - cpu
                totals["wall_s"] += time.perf_counter() - wall
                totals["steps"] += 1

    runner.run_step = timed
    return totals


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0], allow_abbrev=False)
    parser.add_argument("--model", required=True)
    parser.add_argument("--speculative", choices=("lookup", "draft", "auto"), default="auto")
    parser.add_argument("--draft-model", default=None)
    parser.add_argument("--workload", choices=WORKLOADS, default="nothing")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--waves", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None, help="the figures as JSON (appended to a list)")
    args = parser.parse_args(argv)
    engines = {
        name: start(args.model, name, args.max_tokens, args.draft_model) for name in ("off", args.speculative)
    }
    waves = [
        requests(engines["off"], args.workload, args.concurrency, args.max_tokens, wave * args.concurrency)
        for wave in range(args.waves)
    ]
    for name, generator in engines.items():  # warm: every shape once, the gate's costs measured
        for index, wave in enumerate(waves):
            run(generator, wave, f"warm-{name}-{index}")
    totals = {name: timed_steps(generator) for name, generator in engines.items()}
    verifies = {name: counter(g, "decode_forwards", {"kind": "verify"}) for name, g in engines.items()}
    for round_index in range(args.rounds):
        order = list(engines) if round_index % 2 == 0 else list(reversed(engines))
        for name in order:
            for index, wave in enumerate(waves):
                run(engines[name], wave, f"{name}-{round_index}-{index}")
    result: dict[str, Any] = {
        "model": args.model,
        "speculative": args.speculative,
        "draft_model": args.draft_model,
        "workload": args.workload,
        "concurrency": args.concurrency,
        "rounds": args.rounds,
        "waves": args.waves,
        "load_average": os.getloadavg()[0],
        "started": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()),
    }
    for name, generator in engines.items():
        total = totals[name]
        steps = max(1.0, total["steps"])
        verified = counter(generator, "decode_forwards", {"kind": "verify"}) - verifies[name]
        side = "off" if name == "off" else "mode"
        result[side] = {
            "decode_steps": total["steps"],
            "verify_steps": verified,
            "thread_cpu_ms_per_step": 1e3 * total["cpu_s"] / steps,
            "wall_ms_per_step": 1e3 * total["wall_s"] / steps,
        }
        print(
            f"{name}: {total['steps']:.0f} decode steps ({verified:.0f} verify), thread CPU "
            f"{1e3 * total['cpu_s'] / steps:.3f} ms a step, "
            f"wall {1e3 * total['wall_s'] / steps:.3f} ms a step"
        )
    print(f"load average {result['load_average']:.1f}")
    if args.out is not None:
        runs = json.loads(args.out.read_text()) if args.out.exists() else []
        args.out.write_text(json.dumps([*runs, result], indent=2) + "\n")
    for generator in engines.values():
        generator.stop()


if __name__ == "__main__":
    main()
