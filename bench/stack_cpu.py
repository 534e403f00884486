"""The CPU a streamed token costs in each process of the served stack (issue 37.2: "say where the
rest goes ... gRPC"), beside the forward's: the engine and the facade started as in
bench/peers.py, one streamed greedy chat completion at a time, and each process's CPU time (and
each engine thread's) per token read from /proc (Linux).

On two cores the facade's work per token and the engine's gRPC side run on the cores the forward's
MLX and BLAS threads compute on, so their CPU per token is what they can take from the step.
The engine's threads are listed by CPU per token, busiest first: MLX's and BLAS's compute threads
and the generation thread (graph building and dispatch: bench/step_phases.py) lead; the rest are
the gRPC server's and asyncio's.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m bench.stack_cpu [--tokens 96] [--rounds 3]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.bench_model import DEFAULT_DIR, build_bench_model
from bench.peers import chat, start_vlmserve, stream

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(stat_path: str) -> float:
    """utime + stime of a /proc stat file."""
    with open(stat_path) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def thread_seconds(pid: int) -> dict[int, float]:
    found = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            found[int(tid)] = cpu_seconds(f"/proc/{pid}/task/{tid}/stat")
        except OSError:  # the thread ended
            continue
    return found


async def rounds(tokens: int, count: int) -> list[dict[str, Any]]:
    logs = Path(tempfile.mkdtemp(prefix="vlmserve-stack-cpu-"))
    server = start_vlmserve(build_bench_model(DEFAULT_DIR)[0], logs)
    facade, engine = server.services
    measured = []
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:
            await stream(client, server, chat(server.model, [{"role": "user", "content": "warm up"}], 4))
            for index in range(count):
                request = chat(
                    server.model, [{"role": "user", "content": f"{index} Describe the sea"}], tokens
                )
                facade_before = cpu_seconds(f"/proc/{facade.process.pid}/stat")
                threads_before = thread_seconds(engine.process.pid)
                engine_before = cpu_seconds(f"/proc/{engine.process.pid}/stat")
                started = time.perf_counter()
                streamed = await stream(client, server, request)
                wall = time.perf_counter() - started
                threads = thread_seconds(engine.process.pid)
                produced = max(1, streamed.tokens)
                per_thread = sorted(
                    (
                        1000 * (seconds - threads_before.get(tid, 0.0)) / produced
                        for tid, seconds in threads.items()
                    ),
                    reverse=True,
                )
                measured.append(
                    {
                        "tokens": streamed.tokens,
                        "tok_per_s": streamed.tokens / wall,
                        "facade_cpu_ms_per_token": 1000
                        * (cpu_seconds(f"/proc/{facade.process.pid}/stat") - facade_before)
                        / produced,
                        "engine_cpu_ms_per_token": 1000
                        * (cpu_seconds(f"/proc/{engine.process.pid}/stat") - engine_before)
                        / produced,
                        "engine_threads_cpu_ms_per_token": [
                            round(value, 2) for value in per_thread if value > 0
                        ],
                        "engine_beyond_three_busiest_ms_per_token": sum(per_thread[3:]),
                    }
                )
                print(json.dumps(measured[-1]), flush=True)
    finally:
        server.stop()
    return measured


def summary(measured: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("tok_per_s", "facade_cpu_ms_per_token", "engine_beyond_three_busiest_ms_per_token")
    return {f"{key}_median": statistics.median(entry[key] for entry in measured) for key in keys}


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0], allow_abbrev=False)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("bench/results/stack_cpu.json"))
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    measured = asyncio.run(rounds(args.tokens, args.rounds))
    result = {
        "load_average": [load_before, os.getloadavg()],
        "summary": summary(measured),
        "rounds": measured,
    }
    print(json.dumps(result["summary"]))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
