"""One WebSocket pushing many large `response.create` messages while a response runs (issue 39,
finding 3: 150 x 15 MiB took the facade from 94 to 2,030 MiB). The facade's peak RSS (VmHWM)
while the client keeps sending for `--seconds`, then how many messages it got through.

    python bench/websocket_queue.py --messages 150 --mib 15

The scripted engine answers slowly (`--chunks` chunks `--delay-s` apart), so the first response
runs while the rest are sent. Linux only.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import websockets.asyncio.client

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.big_bodies import peak_rss_mib  # noqa: E402
from tests._services import free_port, process_env, start_facade  # noqa: E402


async def push(url: str, messages: int, mib: int, seconds: float) -> int:
    """Send `messages` creates of `mib` MiB on one socket for at most `seconds`; how many went."""
    text = json.dumps({"type": "response.create", "model": "default", "input": "y" * (mib * 2**20 - 200)})
    sent = 0
    async with websockets.asyncio.client.connect(url, max_size=None, write_limit=2**20) as connection:

        async def send_all() -> None:
            nonlocal sent
            for _ in range(messages):
                await connection.send(text)
                sent += 1

        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(send_all(), seconds)
    return sent


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--messages", type=int, default=150)
    parser.add_argument("--mib", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=30.0)
    parser.add_argument("--chunks", type=int, default=600)
    parser.add_argument("--delay-s", type=float, default=0.1)
    args = parser.parse_args()
    logs = Path(tempfile.mkdtemp(prefix="vlmserve-ws-"))
    engine_address = f"127.0.0.1:{free_port()}"
    engine = subprocess.Popen(
        [
            sys.executable,
            *("-m", "tests.facade.fake_engine_server", "--address", engine_address),
            *("--chunks", str(args.chunks), "--delay-s", str(args.delay_s)),
        ],
        cwd=REPO,
        env=process_env(),
    )
    try:
        time.sleep(1.5)
        facade = start_facade(logs, engine_address, store_path=logs / "store.sqlite3")
        try:
            pid = facade.process.pid
            before = peak_rss_mib(pid)
            url = facade.address.replace("http", "ws") + "/v1/responses"
            sent = asyncio.run(push(url, args.messages, args.mib, args.seconds))
            peak = peak_rss_mib(pid)
        finally:
            facade.stop()
    finally:
        engine.terminate()
        engine.wait(10)
    result = {
        "messages": args.messages,
        "mib": args.mib,
        "sent_within_s": args.seconds,
        "sent": sent,
        "rss_before_mib": round(before),
        "peak_rss_mib": round(peak),
    }
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
