"""The scripted engine as a process (`python -m tests.facade.fake_engine_server --address HOST:PORT`).

Stands in for `vlmserve-engine` where a test needs a process, e.g. the launcher test.
`--chunks N --delay-s S` makes every answer N text chunks, S seconds apart (a slow stream).
"""

from __future__ import annotations

import argparse
import asyncio
import signal

from tests.facade.fake_engine import Script, start_fake_engine
from vlmserve.server.lifeline import watch_lifeline


async def serve(
    address: str, *, chunks: int | None = None, delay_s: float = 0.0, model: str | None = None
) -> None:
    running = await start_fake_engine(address)
    if model is not None:
        running.servicer.info.model_id = model
    if chunks is not None:
        running.servicer.script = Script(
            text_chunks=[f"t{index} " for index in range(chunks)], delay_s=delay_s
        )
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(signum, stop.set)
    await stop.wait()
    await running.stop()


def main() -> None:
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser.add_argument("--address", required=True)
    parser.add_argument("--model")
    parser.add_argument("--drain-seconds", type=float)  # what the launcher passes; nothing to drain here
    parser.add_argument("--log-format")  # also passed by the launcher; this stand-in logs nothing
    parser.add_argument("--chunks", type=int)
    parser.add_argument("--delay-s", type=float, default=0.0)
    args = parser.parse_args()
    watch_lifeline()  # as the real engine does: stop when the launcher that started us is gone
    asyncio.run(serve(args.address, chunks=args.chunks, delay_s=args.delay_s, model=args.model))


if __name__ == "__main__":
    main()
