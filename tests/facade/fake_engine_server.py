"""The scripted engine as a process (`python -m tests.facade.fake_engine_server --address HOST:PORT`).

Stands in for `vlmserve-engine` where a test needs a process, e.g. the launcher test.
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from tests.facade.fake_engine import start_fake_engine


async def serve(address: str) -> None:
    running = await start_fake_engine(address)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await running.stop()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--address", required=True)
    parser.add_argument("--model")
    args = parser.parse_args()
    asyncio.run(serve(args.address))


if __name__ == "__main__":
    main()
