"""What token logprobs cost the facade (issue 26, item 11): its CPU and the bytes it sends and
stores per token, without logprobs, with them, and with 20 alternatives per token.

The facade runs in this process (its real app and SQLite store) against scripted engines in
child processes (one per side, each streaming `--tokens` one-token chunks at once), so this
process's CPU time is the facade's alone. Per round, side by side, the order rotating:

* `--streams` concurrent `stream: true` responses, every byte read: facade CPU µs per token and
  SSE bytes per token;
* one `background: true` run: the bytes its stored events take per token (`events_size`), and
  the whole stored response's.

    .venv/bin/python bench/facade_logprobs_cost.py --tokens 400 --streams 16 --rounds 3 \\
        --out bench/results/facade-logprobs-cost.json

Reports medians per side and their ratio to "off".
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import json
import multiprocessing
import statistics
import sys
import tempfile
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: reach the tests' scripted engine without installing it

from tests.facade.fake_engine import Script, start_fake_engine  # noqa: E402
from vlmserve.client import AsyncEngineClient  # noqa: E402
from vlmserve.engine.v1 import engine_pb2 as pb  # noqa: E402
from vlmserve.facade import FacadeSettings, Store, create_app  # noqa: E402

# side -> top_logprobs (None: no logprobs asked)
SIDES: dict[str, int | None] = {"off": None, "logprobs": 0, "top20": 20}
WORDS = [" the", " model", " answer", " is", " here", ",", " and", " more", " text", "."]


def script(tokens: int, top: int) -> Script:
    def entry(index: int) -> pb.TokenLogprob:
        alternatives = [
            pb.TopLogprob(token=WORDS[(index + k) % len(WORDS)], logprob=-0.1 * (k + 1)) for k in range(top)
        ]
        return pb.TokenLogprob(token=WORDS[index % len(WORDS)], logprob=-0.05, top_logprobs=alternatives)

    texts = [WORDS[index % len(WORDS)] for index in range(tokens)]
    return Script(
        text_chunks=texts,
        text_logprobs=[[entry(index)] for index in range(tokens)],
        usage=pb.Usage(input_tokens=5, output_tokens=tokens),
    )


def serve_engine(tokens: int, top: int, pipe: Connection) -> None:
    async def run() -> None:
        engine = await start_fake_engine()
        engine.servicer.script = script(tokens, top)
        pipe.send(engine.address)
        await asyncio.get_running_loop().run_in_executor(None, pipe.recv)
        await engine.server.stop(None)

    asyncio.run(run())


def body(side: str, model: str, **extra: Any) -> dict[str, Any]:
    top = SIDES[side]
    payload: dict[str, Any] = {"model": model, "input": "go", **extra}
    if top is not None:
        payload["include"] = ["message.output_text.logprobs"]
        payload["top_logprobs"] = top
    return payload


async def stream_one(http: httpx.AsyncClient, side: str) -> int:
    received = 0
    async with http.stream("POST", "/v1/responses", json=body(side, side, stream=True)) as reply:
        assert reply.status_code == 200, await reply.aread()
        async for data in reply.aiter_raw():
            received += len(data)
    return received


async def background_one(http: httpx.AsyncClient, store: Store, side: str) -> tuple[int, int]:
    """One background run, its stream read to the end (its terminal events are stored first)."""
    response_id = ""
    async with http.stream(
        "POST", "/v1/responses", json=body(side, side, background=True, stream=True)
    ) as reply:
        assert reply.status_code == 200, await reply.aread()
        async for line in reply.aiter_lines():
            if not response_id and line.startswith("data: {"):
                response_id = json.loads(line.removeprefix("data: "))["response"]["id"]
    query = "SELECT events_size, size FROM responses WHERE id = ?"
    ((events_size, size),) = store.db.query(query, (response_id,))
    return int(events_size), int(size)


async def measure(tokens: int, streams: int, rounds: int) -> dict[str, Any]:
    context = multiprocessing.get_context("spawn")
    children: list[tuple[multiprocessing.process.BaseProcess, Connection]] = []
    addresses: dict[str, str] = {}
    for side, top in SIDES.items():
        mine, theirs = context.Pipe()
        child = context.Process(target=serve_engine, args=(tokens, top or 0, theirs), daemon=True)
        child.start()
        addresses[side] = mine.recv()
        children.append((child, mine))
    cpu_us: dict[str, list[float]] = {side: [] for side in SIDES}
    sse_bytes: dict[str, list[float]] = {side: [] for side in SIDES}
    stored: dict[str, tuple[int, int]] = {}
    try:
        with tempfile.TemporaryDirectory() as folder:
            settings = FacadeSettings(
                store_path=Path(folder) / "facade.sqlite3",
                engine=tuple(f"{side}={address}" for side, address in addresses.items()),
            )
            store = Store.sqlite(settings.store_path)
            clients = {side: AsyncEngineClient(address) for side, address in addresses.items()}
            app = create_app(settings, engine=clients, store=store)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench", timeout=600) as http:
                names = list(SIDES)
                for index in range(rounds + 1):  # the first round warms up and is not counted
                    for side in names[index % 3 :] + names[: index % 3]:
                        started = time.process_time()
                        sizes = await asyncio.gather(*(stream_one(http, side) for _ in range(streams)))
                        spent = time.process_time() - started
                        if index > 0:
                            cpu_us[side].append(1e6 * spent / (streams * tokens))
                            sse_bytes[side].append(statistics.mean(sizes) / tokens)
                        stored[side] = await background_one(http, store, side)
            for client in clients.values():
                await client.close()
            store.close()
    finally:
        for child, pipe in children:
            pipe.send("stop")
            child.join(10)
    cpu = {side: statistics.median(values) for side, values in cpu_us.items()}
    sent = {side: statistics.median(values) for side, values in sse_bytes.items()}
    return {
        "tokens": tokens,
        "streams": streams,
        "rounds": rounds,
        "facade_cpu_us_per_token": {side: round(value, 1) for side, value in cpu.items()},
        "cpu_vs_off": {side: round(value / cpu["off"], 2) for side, value in cpu.items()},
        "sse_bytes_per_token": {side: round(value, 1) for side, value in sent.items()},
        "bytes_vs_off": {side: round(value / sent["off"], 2) for side, value in sent.items()},
        "stored_event_bytes": {side: value[0] for side, value in stored.items()},
        "stored_response_bytes": {side: value[1] for side, value in stored.items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--tokens", type=int, default=400)
    parser.add_argument("--streams", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--profile", type=Path, help="write a cProfile of the facade's side here")
    args = parser.parse_args()
    profile = cProfile.Profile() if args.profile is not None else None
    if profile is not None:
        profile.enable()
    result = asyncio.run(measure(args.tokens, args.streams, args.rounds))
    if profile is not None:
        profile.disable()
        profile.dump_stats(args.profile)
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
