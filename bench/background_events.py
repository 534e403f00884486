"""What storing every event costs a background response (docs/responses-api.md, "Background
responses"): the facade's time per engine chunk, foreground stream against background run.

The facade runs in this process (its real app and SQLite store, a file in a temporary folder)
against a scripted engine on a real gRPC server that sends `--chunks` text chunks at once, so
what is timed is the facade. Per round, side by side:

* `foreground`: `stream: true`, every event read from the response;
* `background`: `background: true, stream: true`, the same events read from the store as they are
  written (each chunk's events are one SQLite transaction before they are sent).

    .venv/bin/python bench/background_events.py --chunks 500 --rounds 5 \\
        --out bench/results/background-events.json

Reports the median wall and CPU microseconds per chunk of each mode and their difference.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import httpx

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: reach the tests' scripted engine without installing it

from tests.facade.fake_engine import Script, start_fake_engine  # noqa: E402
from vlmserve.client import AsyncEngineClient  # noqa: E402
from vlmserve.facade import FacadeSettings, Store, create_app  # noqa: E402

MODES = ("foreground", "background")


async def one_response(http: httpx.AsyncClient, mode: str) -> int:
    """Send one streamed response and read it to its end; how many events it had."""
    body: dict[str, Any] = {"model": "default", "input": "go", "stream": True}
    if mode == "background":
        body["background"] = True
    events = 0
    async with http.stream("POST", "/v1/responses", json=body) as reply:
        async for line in reply.aiter_lines():
            if line.startswith("data:") and line != "data: [DONE]":
                events += 1
    return events


async def measure(chunks: int, rounds: int) -> dict[str, Any]:
    engine = await start_fake_engine()
    engine.servicer.script = Script(text_chunks=["tok "] * chunks)
    client = AsyncEngineClient(engine.address)
    seconds: dict[str, list[float]] = {mode: [] for mode in MODES}
    cpu: dict[str, list[float]] = {mode: [] for mode in MODES}
    events: dict[str, int] = {}
    try:
        with tempfile.TemporaryDirectory() as folder:
            settings = FacadeSettings(store_path=Path(folder) / "facade.sqlite3")
            store = Store.sqlite(settings.store_path)
            app = create_app(settings, engine=client, store=store)
            transport = httpx.ASGITransport(app=app)
            async with httpx.AsyncClient(transport=transport, base_url="http://bench", timeout=600) as http:
                for mode in MODES:  # warm-up
                    await one_response(http, mode)
                for _ in range(rounds):
                    for mode in MODES:
                        started, cpu_started = time.perf_counter(), time.process_time()
                        events[mode] = await one_response(http, mode)
                        seconds[mode].append(time.perf_counter() - started)
                        cpu[mode].append(time.process_time() - cpu_started)
            store.close()
    finally:
        await client.close()
        await engine.server.stop(None)
    per_chunk = {mode: statistics.median(seconds[mode]) / chunks * 1e6 for mode in MODES}
    cpu_per_chunk = {mode: statistics.median(cpu[mode]) / chunks * 1e6 for mode in MODES}
    return {
        "chunks": chunks,
        "rounds": rounds,
        "events": events,
        "wall_us_per_chunk": per_chunk,
        "cpu_us_per_chunk": cpu_per_chunk,
        "background_extra_wall_us_per_chunk": per_chunk["background"] - per_chunk["foreground"],
        "background_extra_cpu_us_per_chunk": cpu_per_chunk["background"] - cpu_per_chunk["foreground"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--chunks", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    result = asyncio.run(measure(args.chunks, args.rounds))
    text = json.dumps(result, indent=2)
    print(text)
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
