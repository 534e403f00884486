"""One engine vs two behind one facade: the same load, side by side, alternating rounds.

Starts N engines (each with its own metrics port), one facade with `--engine-address a,b`
(gRPC `round_robin`), runs bench/load.py's load against it, and reads from each engine's
`/metrics` how many requests and tokens it served, and from /proc how much CPU it used. On a
machine with fewer cores than the engines need, two engines compete for the same cores: the
figures say so rather than hide it (`cpu_s` per engine, `cores` in the JSON).

    python bench/engines_scaling.py --model /tmp/vlmserve-bench-model --requests 32 \\
        --concurrency 8 --max-output-tokens 32 --rounds 2 --out bench/results/engines-scaling.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.batching import cpu_seconds  # noqa: E402
from bench.load import LoadConfig, run_load  # noqa: E402
from tests._prometheus import metric_samples  # noqa: E402
from tests._services import ServiceProcess, free_port, start_engine, start_facade  # noqa: E402


def scrape(port: int) -> dict[str, float]:
    return metric_samples(httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=10).text)


def served(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    def moved(name: str) -> float:
        return after.get(name, 0.0) - before.get(name, 0.0)

    requests = sum(
        moved(name) for name in after if name.startswith('vlmserve_engine_requests_total{kind="generate"')
    )
    return {"requests": requests, "output_tokens": moved("vlmserve_engine_output_tokens_total")}


def run_round(engines: int, args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    ports = [free_port() for _ in range(engines)]
    started: list[ServiceProcess] = []
    facade: ServiceProcess | None = None
    try:
        for port in ports:
            started.append(start_engine(logs, model=args.model, extra=("--metrics-port", str(port))))
        address = "ipv4:" + ",".join(engine.address for engine in started)
        facade = start_facade(logs, address, store_path=logs / f"store-{time.monotonic_ns()}.sqlite3")
        config = LoadConfig(
            base_url=facade.address,
            requests=args.requests,
            concurrency=args.concurrency,
            stream=True,
            max_output_tokens=args.max_output_tokens,
            prompt="Write a long story about a lighthouse.",
        )
        before = [scrape(port) for port in ports]
        cpu_before = [cpu_seconds([engine.process.pid]) for engine in started]
        report = asyncio.run(run_load(config))
        per_engine = [
            {**served(b, scrape(port)), "cpu_s": round(cpu_seconds([engine.process.pid]) - c, 2)}
            for b, port, engine, c in zip(before, ports, started, cpu_before, strict=True)
        ]
    finally:
        if facade is not None:
            facade.stop()
        for engine in started:
            engine.stop()
    tokens = sum(engine["output_tokens"] for engine in per_engine)
    cpu = sum(engine["cpu_s"] for engine in per_engine)
    return {
        "engines": engines,
        "ok": report.ok,
        "errors": report.errors,
        "wall_s": report.wall_s,
        "output_tok_per_s": round(tokens / report.wall_s, 2),
        "output_tok_per_engine_cpu_s": round(tokens / cpu, 2) if cpu else None,
        "ttft_p50_s": report.ttft_s["p50"],
        "latency_p50_s": report.latency_s["p50"],
        "per_engine": per_engine,
        "load": asdict(config),
    }


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--model", default=None, help="model path (default: the engine's fixture model)")
    parser.add_argument("--requests", type=int, default=32)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-output-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=2, help="alternating 1-engine / 2-engine rounds")
    parser.add_argument("--out", type=Path, required=True, help="JSON results")
    args = parser.parse_args(argv)
    logs = Path(tempfile.mkdtemp(prefix="vlmserve-engines-"))
    rounds = []
    for index in range(args.rounds):
        for engines in (1, 2) if index % 2 == 0 else (2, 1):
            result = run_round(engines, args, logs)
            rounds.append(result)
            print(
                f"{engines} engine(s): {result['output_tok_per_s']} tok/s wall, "
                f"{result['output_tok_per_engine_cpu_s']} tok/engine-CPU-s, ok {result['ok']}, "
                f"split {[engine['requests'] for engine in result['per_engine']]}",
                flush=True,
            )
    summary = {}
    for engines in (1, 2):
        mine = [r for r in rounds if r["engines"] == engines]
        summary[f"{engines}_engines"] = {
            "output_tok_per_s": round(sum(r["output_tok_per_s"] for r in mine) / len(mine), 2),
            "output_tok_per_engine_cpu_s": round(
                sum(r["output_tok_per_engine_cpu_s"] or 0 for r in mine) / len(mine), 2
            ),
        }
    one, two = summary["1_engines"], summary["2_engines"]
    summary["two_over_one_wall"] = round(two["output_tok_per_s"] / one["output_tok_per_s"], 3)
    results = {
        "cores": os.cpu_count(),
        "load_average_at_end": os.getloadavg(),
        "summary": summary,
        "rounds": rounds,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print(json.dumps(summary, indent=2))
    print(f"wrote {args.out}; logs in {logs}")
    return 0 if all(r["ok"] == args.requests for r in rounds) else 1


if __name__ == "__main__":
    sys.exit(main())
