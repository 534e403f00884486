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

Before and after a change, in one run: `--baseline-tree DIR` (a checkout at the older commit with
its own .venv, as bench/peers.py takes) serves the same stack from there too, and each round
streams each API from both, the order flipping each round. `--fake-engine-pace S` puts the
scripted engine of the tests (tests/facade/fake_engine_server.py: one text chunk per token, S
seconds apart) behind each facade instead of the model, so the facade's CPU per token is
measured without the forward's two busy cores beside it (the engine's figures are then the
stand-in's).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import httpx

from bench.bench_model import DEFAULT_DIR, build_bench_model
from bench.peers import Server, chat, start_vlmserve, stream, wait_for_models
from tests._services import BIN, start_facade, start_fake_engine

TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def cpu_seconds(stat_path: str, *, children: bool = False) -> float:
    """utime + stime of a /proc stat file (`children`: and cutime + cstime, its waited-for
    children's)."""
    with open(stat_path) as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return sum(int(value) for value in fields[11 : 15 if children else 13]) / TICKS


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


def start_fake_stack(logs: Path, tree: Path | None, chunks: int, pace_s: float) -> Server:
    """A facade (this tree's, or `tree`'s) in front of the scripted engine: `chunks` text chunks,
    `pace_s` apart, whatever is asked."""
    engine = start_fake_engine(logs, chunks=chunks, delay_s=pace_s)
    address = engine.address
    bin_dir = BIN if tree is None else tree / ".venv" / "bin"
    try:
        facade = start_facade(
            logs, address, store_path=logs / f"store-{time.monotonic_ns()}.sqlite3", bin_dir=bin_dir
        )
    except BaseException:
        engine.stop()
        raise
    model = wait_for_models(facade, {}, timeout=60)
    return Server(tree_name(tree), facade.address, model, {}, [facade, engine])


def tree_name(tree: Path | None) -> str:
    if tree is None:
        return "vlmserve"
    commit = subprocess.run(
        ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], capture_output=True, text=True, check=True
    ).stdout.strip()
    return f"vlmserve@{commit}"


async def rounds(
    tokens: int,
    count: int,
    apis: Sequence[str],
    baseline_tree: Path | None = None,
    fake_engine_pace_s: float | None = None,
) -> list[dict[str, Any]]:
    logs = Path(tempfile.mkdtemp(prefix="vlmserve-stack-cpu-"))
    servers: list[Server] = []
    measured: list[dict[str, Any]] = []
    try:
        for tree in (None, baseline_tree) if baseline_tree is not None else (None,):
            if fake_engine_pace_s is None:
                servers.append(start_vlmserve(build_bench_model(DEFAULT_DIR)[0], logs, tree))
            else:
                servers.append(start_fake_stack(logs, tree, tokens, fake_engine_pace_s))
        for server in servers:
            async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:
                await stream(client, server, chat(server.model, [{"role": "user", "content": "warm up"}], 4))
        for index in range(count):
            order = servers if index % 2 == 0 else servers[::-1]
            for api in apis:
                for server in order:
                    measured.append(
                        await one_stream(server, api, index, tokens, fake_engine_pace_s is not None)
                    )
                    print(json.dumps(measured[-1]), flush=True)
    finally:
        for server in servers:
            server.stop()
    return measured


async def one_stream(server: Server, api: str, index: int, tokens: int, fake: bool) -> dict[str, Any]:
    """One streamed request of `api`: each process's CPU per token it took."""
    facade, engine = server.services
    async with httpx.AsyncClient(base_url=server.url, timeout=600) as client:
        facade_before = cpu_seconds(f"/proc/{facade.process.pid}/stat")
        threads_before = thread_seconds(engine.process.pid)
        engine_before = cpu_seconds(f"/proc/{engine.process.pid}/stat")
        started = time.perf_counter()
        streamed = await stream_api(client, server, api, f"{index} Describe the sea", tokens)
        wall = time.perf_counter() - started
        threads = thread_seconds(engine.process.pid)
        facade_after = cpu_seconds(f"/proc/{facade.process.pid}/stat")
        engine_after = cpu_seconds(f"/proc/{engine.process.pid}/stat")
    # The scripted engine's usage is fixed: its chunks are the tokens.
    produced = tokens if fake else max(1, streamed)
    per_thread = sorted(
        (1000 * (seconds - threads_before.get(tid, 0.0)) / produced for tid, seconds in threads.items()),
        reverse=True,
    )
    return {
        "target": server.name,
        "api": api,
        "tokens": produced,
        "tok_per_s": produced / wall,
        "facade_cpu_ms_per_token": 1000 * (facade_after - facade_before) / produced,
        "engine_cpu_ms_per_token": 1000 * (engine_after - engine_before) / produced,
        "engine_threads_cpu_ms_per_token": [round(value, 2) for value in per_thread if value > 0],
        "engine_beyond_three_busiest_ms_per_token": sum(per_thread[3:]),
    }


def summary(measured: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Medians per target and API (`target api`)."""
    keys = ("tok_per_s", "facade_cpu_ms_per_token", "engine_beyond_three_busiest_ms_per_token")
    groups = dict.fromkeys((entry["target"], entry["api"]) for entry in measured)
    return {
        f"{target} {api}": {
            f"{key}_median": statistics.median(
                entry[key] for entry in measured if (entry["target"], entry["api"]) == (target, api)
            )
            for key in keys
        }
        for target, api in groups
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0], allow_abbrev=False)
    parser.add_argument("--tokens", type=int, default=96)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument(
        "--api", choices=APIS, action="append", help="the APIs streamed, each round in turn (default all)"
    )
    parser.add_argument(
        "--baseline-tree",
        type=Path,
        help="also serve from this checkout (its own .venv), in turn with this one",
    )
    parser.add_argument(
        "--fake-engine-pace",
        type=float,
        metavar="S",
        help="the tests' scripted engine behind each facade, a chunk every S seconds, instead of the model",
    )
    parser.add_argument("--out", type=Path, default=Path("bench/results/stack_cpu.json"))
    args = parser.parse_args(argv)
    load_before = os.getloadavg()
    measured = asyncio.run(
        rounds(args.tokens, args.rounds, args.api or APIS, args.baseline_tree, args.fake_engine_pace)
    )
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
