"""Served single stream: CPU per token of every server process, vlmserve against one peer.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m bench.peer_served_cpu [--peer vllm-mlx] [--tokens 128] [--rounds 3]

bench/peers.py's servers (same flags, same model), one streamed greedy chat completion at a
time, the two in turn (the order flipping each round). For each: tok/s after the first token,
and the CPU seconds (utime + stime from /proc, children included) each server process spent
per token — ours is the engine plus the facade, the peer's its one process. CPU time is what a
busy machine does not move; on two cores every host millisecond is one the forward's threads
could have had.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.bench_model import build_bench_model
from bench.peers import PEERS, PEERS_ROOT, Server, chat, start_peer, start_vlmserve, stream
from bench.stack_cpu import cpu_seconds

PROMPT = "Write a long story about a lighthouse keeper and the storm that changed everything."


def process_cpu_seconds(pid: int) -> float:
    """utime + stime of a process and its waited-for children."""
    return cpu_seconds(f"/proc/{pid}/stat", children=True)


def processes(server: Server) -> dict[str, int]:
    return {service.address.rsplit(":", 1)[-1]: service.process.pid for service in server.services}


async def one(server: Server, tokens: int) -> dict[str, Any]:
    pids = {f"{server.name}:{port}": pid for port, pid in processes(server).items()}
    before = {name: process_cpu_seconds(pid) for name, pid in pids.items()}
    async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:
        streamed = await stream(
            client, server, chat(server.model, [{"role": "user", "content": PROMPT}], tokens)
        )
    spent = {name: process_cpu_seconds(pid) - before[name] for name, pid in pids.items()}
    decode = streamed.latency_s - (streamed.ttft_s or 0.0)
    return {
        "tokens": streamed.tokens,
        "ttft_s": streamed.ttft_s,
        # bench/peers.py's single-stream figure: every token over the whole request's wall
        "tok_s_with_ttft": streamed.tokens / streamed.latency_s,
        "tok_s": (streamed.tokens - 1) / decode,
        "cpu_ms_per_token": {name: 1000 * s / streamed.tokens for name, s in spent.items()},
        "cpu_ms_per_token_total": 1000 * sum(spent.values()) / streamed.tokens,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--peer", default="vllm-mlx", choices=list(PEERS))
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    path, _ = build_bench_model()
    logs = Path(tempfile.mkdtemp(prefix="peer-served-cpu-"))
    servers = [start_vlmserve(path, logs), start_peer(args.peer, path, logs, PEERS_ROOT)]
    rounds: list[dict[str, Any]] = []
    try:
        for server in servers:  # warm each (first request's compile and caches)
            asyncio.run(one(server, 8))
        for index in range(args.rounds):
            order = servers if index % 2 == 0 else servers[::-1]
            row = {server.name: asyncio.run(one(server, args.tokens)) for server in order}
            rounds.append(row)
            print(json.dumps(row), flush=True)
    finally:
        for server in servers:
            server.stop()
    names = [server.name for server in servers]
    summary = {
        name: {
            "tok_s": statistics.median(r[name]["tok_s"] for r in rounds),
            "ttft_s": statistics.median(r[name]["ttft_s"] or 0.0 for r in rounds),
            "tok_s_with_ttft": statistics.median(r[name]["tok_s_with_ttft"] for r in rounds),
            "cpu_ms_per_token_total": statistics.median(r[name]["cpu_ms_per_token_total"] for r in rounds),
        }
        for name in names
    }
    print(json.dumps(summary))
    if args.out is not None:
        args.out.write_text(json.dumps({"rounds": rounds, "median": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
