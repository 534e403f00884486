"""Speculative decoding against mlx-vlm (issue 21.6): vlmserve (facade -> engine, `--speculative
auto` and `off`) beside mlx-vlm 0.7.10's own `mlx_vlm.server` (its defaults) and in-process
`mlx_vlm.stream_generate`, the same requests through `POST /v1/responses`, one run, alternating.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m bench.speculative_vs_mlx_vlm --out bench/results/speculative_vs_mlx_vlm.json \\
        --plot docs/performance-speculative-vs-mlx-vlm.png

Workloads (each on its own model; the servers are bench/batching.py's):
- copy (copying model, models/qwen2-vl-copying): one stream, greedy, held-out cases of
  training/copying.py (return a JSON object / function with one field / line changed);
- copy8 (copying model): 8 such cases at once, each its own;
- nothing (144M random model of bench/bench_model.py): one stream, temperature 1 (random text:
  nothing to copy, so speculation can only cost);
- concurrent8 (144M model): 8 greedy requests at once, a prompt of its own each (the random
  model's greedy text loops, which prompt lookup predicts: an upper bound on acceptance).
Each round runs every runner on a workload before the next workload, the order flipping every
round, so they never compete for the CPU. Figures: best tok/s over the rounds (the least
disturbed), median tok per CPU-second of each runner's own processes, and for vlmserve the
accepted tokens per verify and output tokens per decode forward (from its Prometheus metrics).
mlx-vlm has no speculation without a drafter model (`--draft-model`: MTP / DFlash / EAGLE3
heads), and none exists for these fixtures, so its default is its only configuration here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import httpx
from prometheus_client.parser import text_string_to_metric_families

from bench.batching import InProcess, Target, Throughput, body, prompt, start_target, timed
from bench.bench_model import DEFAULT_DIR, build_bench_model
from tests._services import free_port
from training.copying import copy_case

REPO = Path(__file__).resolve().parent.parent
COPY_MODEL = REPO / "models" / "qwen2-vl-copying"
# vlmserve-engine flags per vlmserve runner (each also gets --metrics-port).
OURS = {"vlmserve": ("--speculative", "auto"), "vlmserve-off": ("--speculative", "off")}
COUNTERS = {
    "drafted": "vlmserve_engine_speculative_drafted_tokens_total",
    "accepted": "vlmserve_engine_speculative_accepted_tokens_total",
    "verified_rows": "vlmserve_engine_speculative_verified_rows_total",
    "forwards": "vlmserve_engine_decode_forwards_total",
}


@dataclass(frozen=True)
class Workload:
    name: str
    model: str  # "copy" or "text"
    prompts: tuple[str, ...]
    tokens: int
    temperature: float
    concurrent: bool


def workloads(args: argparse.Namespace) -> list[Workload]:
    copies = [copy_case(random.Random(900_000 + i)).prompt for i in range(8)]
    return [
        Workload("copy", "copy", tuple(copies[: args.sequential]), args.copy_tokens, 0.0, False),
        Workload("copy8", "copy", tuple(copies), args.copy_tokens, 0.0, True),
        Workload(
            "nothing", "text", tuple(prompt(i) for i in range(args.sequential)), args.tokens, 1.0, False
        ),
        Workload("concurrent8", "text", tuple(prompt(100 + i) for i in range(8)), args.tokens, 0.0, True),
    ]


@dataclass
class Figures:
    """One runner on one workload over the rounds."""

    throughput: Throughput = field(default_factory=Throughput)
    tokens: list[int] = field(default_factory=list)
    # vlmserve only: summed over the rounds
    counters: dict[str, float] = field(default_factory=lambda: dict.fromkeys(COUNTERS, 0.0))

    def accepted_per_verify(self) -> float:
        rows = self.counters["verified_rows"]
        return self.counters["accepted"] / rows + 1 if rows else 0.0

    def tokens_per_forward(self) -> float:
        forwards = self.counters["forwards"]
        return sum(self.tokens) / forwards if forwards else 0.0


class Ours:
    """A vlmserve target and its engine's metrics endpoint."""

    def __init__(self, name: str, model_dir: Path, logs: Path) -> None:
        port = free_port()
        extra = SimpleNamespace(engine_arg=[*OURS[name], "--metrics-port", str(port)])
        self.target = start_target(name, model_dir, logs, extra)  # type: ignore[arg-type]
        self.metrics_url = f"http://127.0.0.1:{port}/metrics"

    def counters(self) -> dict[str, float]:
        text = httpx.get(self.metrics_url, timeout=10).text
        values = dict.fromkeys(COUNTERS, 0.0)
        wanted = {metric: key for key, metric in COUNTERS.items()}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name in wanted:  # decode_forwards: every kind summed
                    values[wanted[sample.name]] += sample.value
        return values


async def run_once(
    runner: Target | InProcess, ours: Ours | None, workload: Workload, figures: Figures
) -> None:
    before = ours.counters() if ours else None
    if isinstance(runner, InProcess):
        measured = await asyncio.to_thread(
            runner.generate, workload.prompts, workload.tokens, workload.temperature
        )
    else:
        requests = [body(runner.model, text, tokens=workload.tokens) for text in workload.prompts]
        for request in requests:
            request["temperature"] = workload.temperature
        tokens, wall, cpu, _ = await timed(runner, requests, one_by_one=not workload.concurrent)
        measured = (tokens, wall, cpu)
    figures.throughput.add(*measured)
    figures.tokens.append(measured[0])
    if ours and before:
        after = ours.counters()
        for key in COUNTERS:
            figures.counters[key] += after[key] - before[key]


def measure_model(
    model_dir: Path, work: Sequence[Workload], runners: Sequence[str], rounds: int, logs: Path
) -> dict[str, dict[str, Figures]]:
    ours = {name: Ours(name, model_dir, logs) for name in runners if name in OURS}
    servers: dict[str, Target] = {name: o.target for name, o in ours.items()}
    if "mlx-vlm-server" in runners:
        servers["mlx-vlm-server"] = start_target("mlx-vlm-server", model_dir, logs, SimpleNamespace())  # type: ignore[arg-type]
    in_process = InProcess(model_dir) if "in-process" in runners else None
    results: dict[str, dict[str, Figures]] = {w.name: {} for w in work}
    try:
        for target in servers.values():  # first forwards of each shape
            asyncio.run(timed(target, [body(target.model, "warm up", tokens=8)], one_by_one=True))
        for round_index in range(rounds):
            for workload in work:
                names = [
                    n for n in runners if n in servers or (n == "in-process" and not workload.concurrent)
                ]
                for name in names if round_index % 2 == 0 else names[::-1]:
                    runner: Target | InProcess | None = servers.get(name, in_process)
                    assert runner is not None
                    figures = results[workload.name].setdefault(name, Figures())
                    asyncio.run(run_once(runner, ours.get(name), workload, figures))
                    print(
                        f"round {round_index + 1} {workload.name} {name} (load {os.getloadavg()[0]:.1f}): "
                        f"{figures.throughput.rounds[-1][0]:.1f} tok/s, "
                        f"{figures.throughput.rounds[-1][1]:.1f} tok/CPU-s, {figures.tokens[-1]} tokens"
                        + (f", {figures.accepted_per_verify():.2f} accepted/verify" if name in ours else ""),
                        flush=True,
                    )
    finally:
        if in_process is not None:
            in_process.stop()
        for target in servers.values():
            target.stop()
    return results


def summarise(results: dict[str, dict[str, Figures]]) -> dict[str, Any]:
    """Per workload: each runner's figures and ours ÷ each other runner (wall and per CPU-second)."""
    summary: dict[str, Any] = {}
    for workload, by_runner in results.items():
        entry: dict[str, Any] = {"runners": {}}
        for name, figures in by_runner.items():
            entry["runners"][name] = {
                "tok_s": figures.throughput.tok_s,
                "tok_per_cpu_s": figures.throughput.tok_per_cpu_s,
                "rounds": figures.throughput.rounds,
                "tokens": figures.tokens,
                **({"counters": figures.counters} if name in OURS else {}),
                **(
                    {
                        "accepted_per_verify": figures.accepted_per_verify(),
                        "tokens_per_forward": figures.tokens_per_forward(),
                    }
                    if name in OURS
                    else {}
                ),
            }
        ours = by_runner.get("vlmserve")
        if ours:
            for name, theirs in by_runner.items():
                if name != "vlmserve":
                    key = name.replace("-", "_")
                    entry[f"vs_{key}"] = ours.throughput.tok_s / theirs.throughput.tok_s
                    entry[f"vs_{key}_per_cpu_s"] = (
                        ours.throughput.tok_per_cpu_s / theirs.throughput.tok_per_cpu_s
                    )
        summary[workload] = entry
    return summary


GOALS = {"copy": 1.5, "nothing": 0.97, "concurrent8": 1.25, "copy8": 1.25}


def plot(summary: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    names = [w for w in summary if "vs_mlx_vlm_server" in summary[w]]
    figure, axis = plt.subplots(figsize=(9, 4))
    width = 0.2
    series = [
        ("vs_mlx_vlm_server", "÷ mlx-vlm server, wall"),
        ("vs_mlx_vlm_server_per_cpu_s", "÷ mlx-vlm server, per CPU-s"),
        ("vs_in_process", "÷ stream_generate, wall"),
        ("vs_vlmserve_off", "÷ ours --speculative off, wall"),
    ]
    for offset, (key, label) in enumerate(series):
        xs = [i + (offset - 1.5) * width for i in range(len(names))]
        ys = [summary[w].get(key, 0.0) for w in names]
        axis.bar(xs, ys, width, label=label)
    for i, workload in enumerate(names):
        goal = GOALS.get(workload)
        if goal:
            axis.hlines(goal, i - 2 * width, i + 2 * width, colors="black", linestyles="dashed")
        ours = summary[workload]["runners"]["vlmserve"]
        axis.annotate(
            f"{ours['accepted_per_verify']:.2f} acc/verify\n"
            f"{ours['tokens_per_forward']:.2f} tok/forward\n(all rows)",
            (i, 0.05),
            ha="center",
            fontsize=8,
        )
    axis.axhline(1.0, color="grey", linewidth=0.8)
    axis.set_xticks(range(len(names)), names)
    axis.set(ylabel="vlmserve tok/s ÷ other", title="Speculative decoding vs mlx-vlm (dashed: goal)")
    axis.legend(fontsize=8)
    axis.grid(alpha=0.3, axis="y")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--copy-model", type=Path, default=COPY_MODEL)
    parser.add_argument("--text-model", type=Path, default=DEFAULT_DIR, help="built when missing")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--sequential", type=int, default=3, help="requests of a single-stream workload")
    parser.add_argument("--tokens", type=int, default=48, help="output tokens per 144M-model request")
    parser.add_argument("--copy-tokens", type=int, default=160, help="max output tokens per copy request")
    parser.add_argument(
        "--runners",
        nargs="+",
        default=["vlmserve", "vlmserve-off", "mlx-vlm-server", "in-process"],
        choices=["vlmserve", "vlmserve-off", "mlx-vlm-server", "in-process"],
    )
    parser.add_argument("--workloads", nargs="+", default=["copy", "copy8", "nothing", "concurrent8"])
    parser.add_argument("--out", type=Path, required=True, help="JSON results")
    parser.add_argument("--plot", type=Path, help="PNG plot")
    parser.add_argument(
        "--merge", type=Path, help="an earlier run's results (other workloads) to add to the plot"
    )
    args = parser.parse_args(argv)
    work = [w for w in workloads(args) if w.name in args.workloads]
    results: dict[str, dict[str, Figures]] = {}
    load_before = os.getloadavg()
    models = {"copy": args.copy_model}
    if any(w.model == "text" for w in work):
        models["text"] = build_bench_model(args.text_model)[0]
    with tempfile.TemporaryDirectory() as tmp:
        for kind, model_dir in models.items():
            mine = [w for w in work if w.model == kind]
            if mine:
                results.update(measure_model(model_dir, mine, args.runners, args.rounds, Path(tmp)))
    summary = summarise(results)
    out = {
        "argv": sys.argv[1:],
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "models": {kind: str(path) for kind, path in models.items()},
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "workloads": {w.name: asdict(w) for w in work},
        "summary": summary,
    }
    for workload, entry in summary.items():
        ratios = {k: round(v, 3) for k, v in entry.items() if k.startswith("vs_")}
        ours = entry["runners"].get("vlmserve", {})
        print(
            workload,
            ratios,
            f"accepted/verify {ours.get('accepted_per_verify', 0):.2f}",
            f"tokens/forward {ours.get('tokens_per_forward', 0):.2f}",
        )
    print("load average", out["load_average"])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    if args.plot is not None:
        earlier = json.loads(args.merge.read_text())["summary"] if args.merge else {}
        plot({**earlier, **summary}, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
