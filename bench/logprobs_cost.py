"""What token logprobs cost: decode tok/s of the same request without logprobs, with them, and
with 20 alternatives per token, side by side.

Runs an engine in this process on `--model` (default: the random-weight fixture, which never
stops by itself, so every request decodes its full budget) and sends rounds of the three over
loopback gRPC (the order rotates every round, so drift from other load on the machine hits all
sides alike). Reports, per side, the median engine-measured decode rate and the median process
CPU time per generated token (less swayed than wall time by other load on a shared machine), each
against "off"; `--out` writes the figures as JSON.

    python bench/logprobs_cost.py --rounds 8 --max-tokens 128 --out bench/results/logprobs-cost.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import grpc

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: reach tests/ helpers without installing them

from tests._fixture_models import RANDOM_MODEL_PATH  # noqa: E402
from vlmserve.engine.config import EngineConfig  # noqa: E402
from vlmserve.engine.rpc.server import EngineServer  # noqa: E402
from vlmserve.engine.v1 import engine_pb2 as pb  # noqa: E402
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc  # noqa: E402

# side -> (logprobs, top_logprobs)
SIDES = {"off": (False, 0), "logprobs": (True, 0), "top20": (True, 20)}


def request(max_tokens: int, side: str) -> pb.GenerateRequest:
    logprobs, top = SIDES[side]
    message = pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text="Tell a story."))])
    return pb.GenerateRequest(
        messages=[message],
        sampling=pb.SamplingParams(
            max_tokens=max_tokens, temperature=0.0, logprobs=logprobs, top_logprobs=top
        ),
    )


async def measure(model: str, rounds: int, max_tokens: int) -> dict[str, Any]:
    server = EngineServer(EngineConfig(model=model, max_output_tokens=max_tokens, max_active=1))
    address = await server.start("127.0.0.1:0")
    server.load()
    await server.wait_loaded()
    names = list(SIDES)
    rates: dict[str, list[float]] = {side: [] for side in names}
    cpu_ms: dict[str, list[float]] = {side: [] for side in names}
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.EngineServiceStub(channel)
            for index in range(rounds + 1):  # the first round warms up and is not counted
                for side in names[index % 3 :] + names[: index % 3]:
                    started = time.process_time()
                    reply = await stub.GenerateUnary(
                        pb.GenerateUnaryRequest(request=request(max_tokens, side))
                    )
                    spent = time.process_time() - started
                    result = reply.result
                    assert bool(result.logprobs) == SIDES[side][0]
                    if index > 0:
                        rates[side].append(result.timings.decode_tokens_per_second)
                        cpu_ms[side].append(1000 * spent / result.usage.output_tokens)
    finally:
        await server.shutdown(grace_seconds=1)
    medians = {side: statistics.median(values) for side, values in rates.items()}
    cpu = {side: statistics.median(values) for side, values in cpu_ms.items()}
    return {
        "model": Path(model).name,
        "rounds": rounds,
        "max_tokens": max_tokens,
        "tok_s": {side: round(value, 1) for side, value in medians.items()},
        "vs_off": {side: round(value / medians["off"], 3) for side, value in medians.items()},
        "cpu_ms_per_token": {side: round(value, 3) for side, value in cpu.items()},
        "cpu_vs_off": {side: round(value / cpu["off"], 3) for side, value in cpu.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--model", default=str(RANDOM_MODEL_PATH))
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    figures = asyncio.run(measure(args.model, args.rounds, args.max_tokens))
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
