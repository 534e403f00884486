"""The CPU a streamed token costs in each process of the served stack (issue 37.2: "say where the
rest goes ... gRPC"), beside the forward's: the engine and the facade started as in
bench/peers.py, one streamed greedy request at a time — a chat completion, a Responses request
and an Anthropic Messages request in turn (`--api` picks) — and each process's CPU time (and
each engine thread's) per token read from /proc (Linux).

On two cores the facade's work per token and the engine's gRPC side run on the cores the forward's
MLX and BLAS threads compute on, so their CPU per token is what they can take from the step.
The engine's threads are listed by CPU per token, busiest first: MLX's and BLAS's compute threads
and the generation thread (graph building and dispatch: bench/step_phases.py) lead; the rest are
the gRPC server's and asyncio's.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m bench.stack_cpu [--tokens 96] [--rounds 3] [--api chat --api responses --api messages]
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
from bench.peers import Server, chat, start_vlmserve, stream

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


APIS = ("chat", "responses", "messages")


async def stream_api(client: httpx.AsyncClient, server: Server, api: str, text: str, tokens: int) -> int:
    """One streamed greedy request of `api`, read to its end: the output tokens its usage says."""
    if api == "chat":
        request = chat(server.model, [{"role": "user", "content": text}], tokens)
        return (await stream(client, server, request)).tokens
    if api == "responses":
        path, body = "/v1/responses", {"input": text, "max_output_tokens": tokens}
    else:
        path = "/v1/messages"
        body = {"messages": [{"role": "user", "content": text}], "max_tokens": tokens}
    body |= {"model": server.model, "stream": True, "temperature": 0}
    produced = 0
    async with client.stream("POST", path, json=body, headers=server.headers) as response:
        if response.status_code != 200:
            await response.aread()
            raise RuntimeError(f"HTTP {response.status_code}: {response.text[:300]}")
        async for line in response.aiter_lines():
            if not line.startswith("data: {"):
                continue
            event = json.loads(line.removeprefix("data: "))
            if event["type"] in ("response.completed", "response.incomplete"):
                produced = event["response"]["usage"]["output_tokens"]
            elif event["type"] == "message_delta":
                produced = event["usage"]["output_tokens"]
    return produced


async def rounds(tokens: int, count: int, apis: Sequence[str]) -> list[dict[str, Any]]:
    logs = Path(tempfile.mkdtemp(prefix="vlmserve-stack-cpu-"))
    server = start_vlmserve(build_bench_model(DEFAULT_DIR)[0], logs)
    facade, engine = server.services
    measured = []
    try:
        async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:
            await stream(client, server, chat(server.model, [{"role": "user", "content": "warm up"}], 4))
            for index in range(count):
                for api in apis:
                    facade_before = cpu_seconds(f"/proc/{facade.process.pid}/stat")
                    threads_before = thread_seconds(engine.process.pid)
                    engine_before = cpu_seconds(f"/proc/{engine.process.pid}/stat")
                    started = time.perf_counter()
                    streamed = await stream_api(client, server, api, f"{index} Describe the sea", tokens)
                    wall = time.perf_counter() - started
                    threads = thread_seconds(engine.process.pid)
                    produced = max(1, streamed)
                    per_thread = sorted(
                        (
                            1000 * (seconds - threads_before.get(tid, 0.0)) / produced
                            for tid, seconds in threads.items()
                        ),
                        reverse=True,
                    )
                    measured.append(
                        {
                            "api": api,
                            "tokens": streamed,
                            "tok_per_s": streamed / wall,
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


def summary(measured: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    keys = ("tok_per_s", "facade_cpu_ms_per_token", "engine_beyond_three_busiest_ms_per_token")
    return {
        api: {
            f"{key}_median": statistics.median(entry[key] for entry in measured if entry["api"] == api)
            for key in keys
        }
        for api in dict.fromkeys(entry["api"] for entry in measured)
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0], allow_abbrev=False)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--api", choices=APIS, action="append", help="the APIs streamed, each round in turn (default all)"
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/stack_cpu.json"))
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    measured = asyncio.run(rounds(args.tokens, args.rounds, args.api or APIS))
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
