"""What a grammar costs: decode tok/s of the same request with and without a json_schema, side by side.

Runs an engine in this process on `--model` (default: the random-weight fixture, which never
stops by itself, so every request decodes its full budget) and sends pairs of requests over
loopback gRPC: plain text, then the same with `response_format` json_schema (the order swaps
every pair, so drift from other load on the machine hits both sides alike). Reports the median
engine-measured decode rate of each side and their ratio; `--out` writes the figures as JSON.

    python bench/structured_cost.py --pairs 10 --max-tokens 256 --out bench/results/structured-cost.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
from pathlib import Path
from typing import Any

import grpc

from vlmserve.engine.generator import EngineConfig
from vlmserve.engine.model import RANDOM_MODEL_PATH
from vlmserve.engine.server import EngineServer
from vlmserve.engine.v1 import engine_pb2 as pb
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc

SCHEMA = {
    "type": "object",
    "properties": {
        "title": {"type": "string"},
        "year": {"type": "integer"},
        "tags": {"type": "array", "items": {"type": "string"}},
        "rating": {"enum": ["good", "bad"]},
    },
    "required": ["title", "year", "tags", "rating"],
    "additionalProperties": False,
}


def request(max_tokens: int, *, structured: bool) -> pb.GenerateRequest:
    message = pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text="Describe a film."))])
    generate = pb.GenerateRequest(
        messages=[message], sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0)
    )
    if structured:
        generate.response_format.json_schema.CopyFrom(
            pb.JsonSchemaFormat(name="film", schema_json=json.dumps(SCHEMA), strict=True)
        )
    return generate


async def measure(model: str, pairs: int, max_tokens: int) -> dict[str, Any]:
    server = EngineServer(EngineConfig(model=model, max_output_tokens=max_tokens, max_active=1))
    address = await server.start("127.0.0.1:0")
    server.load()
    await server.wait_loaded()
    rates: dict[str, list[float]] = {"plain": [], "json_schema": []}
    tokens: dict[str, list[int]] = {"plain": [], "json_schema": []}
    try:
        async with grpc.aio.insecure_channel(address) as channel:
            stub = pb_grpc.EngineServiceStub(channel)
            for index in range(pairs + 1):  # the first pair warms up and is not counted
                order = ("plain", "json_schema") if index % 2 == 0 else ("json_schema", "plain")
                for side in order:
                    reply = await stub.GenerateUnary(
                        pb.GenerateUnaryRequest(request=request(max_tokens, structured=side == "json_schema"))
                    )
                    result = reply.result
                    if side == "json_schema":
                        json.loads(result.text)  # the point of the grammar: it always parses
                    if index > 0:
                        rates[side].append(result.timings.decode_tokens_per_second)
                        tokens[side].append(result.usage.output_tokens)
    finally:
        await server.shutdown(grace_seconds=1)
    plain, structured = statistics.median(rates["plain"]), statistics.median(rates["json_schema"])
    return {
        "model": Path(model).name,
        "pairs": pairs,
        "max_tokens": max_tokens,
        "plain_tok_s": round(plain, 1),
        "json_schema_tok_s": round(structured, 1),
        "ratio": round(structured / plain, 3),
        "slower_percent": round(100 * (1 - structured / plain), 1),
        "median_output_tokens": {side: statistics.median(counts) for side, counts in tokens.items()},
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--model", default=str(RANDOM_MODEL_PATH))
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--max-tokens", type=int, default=256)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    figures = asyncio.run(measure(args.model, args.pairs, args.max_tokens))
    print(json.dumps(figures, indent=2))
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
