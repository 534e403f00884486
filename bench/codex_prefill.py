"""Prefill time of a Codex-sized prompt through the engine (docs/codex-shapes.md, "Prefill measurements").

Builds the recorded Codex turn-2 request (tests/codex/data/codex_request_turn2.json) padded with
exec_command history to ~19k OpenAI (o200k) tokens — 18,900 tokens of message, tool-output and tool
text, counted once with an o200k tokenizer; see docs/codex-shapes.md — translates it with
`vlmserve.responses`, and asks the engine for 1 output token, twice (cold, then the same prompt again).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \
        .venv/bin/python bench/codex_prefill.py [--engine-address HOST:PORT] [--model DIR]

Without --engine-address it starts `vlmserve-engine` itself (fixture model unless --model).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: reach tests/ helpers without installing them

from tests._services import start_engine  # noqa: E402
from tests.codex.codex_requests import load_recorded, pad_history  # noqa: E402
from vlmserve.client import EngineClient  # noqa: E402
from vlmserve.engine.v1 import engine_pb2 as pb  # noqa: E402
from vlmserve.responses import build_generate_request  # noqa: E402

# Calibrated with o200k: this padding gives 18,900 tokens of content (~19k with message framing).
TARGET_CHARS = 70_000
CHUNK_CHARS = 3_000


def measure(client: EngineClient, request: pb.GenerateRequest) -> dict[str, float | int]:
    started = time.perf_counter()
    result = client.generate_unary(request, timeout=3600)
    wall = time.perf_counter() - started
    return {
        "wall_seconds": round(wall, 3),
        "time_to_first_token_seconds": round(result.timings.time_to_first_token_seconds, 3),
        "prefill_tokens_per_second": round(result.timings.prefill_tokens_per_second, 1),
        "input_tokens": result.usage.input_tokens,
        "cached_tokens": result.usage.cached_tokens,
        "image_count": result.usage.image_count,
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--engine-address", default=None)
    parser.add_argument("--model", default=None)
    parser.add_argument("--target-chars", type=int, default=TARGET_CHARS)
    parser.add_argument("--dump-request", type=Path, default=None, help="write the Responses JSON here")
    args = parser.parse_args()

    body = pad_history(load_recorded(), args.target_chars, chunk_chars=CHUNK_CHARS)
    if args.dump_request is not None:
        args.dump_request.write_text(json.dumps(body))
    translated = build_generate_request(body)
    request = translated.request
    request.sampling.max_tokens = 1

    engine = None
    address = args.engine_address
    if address is None:
        engine = start_engine(Path(tempfile.mkdtemp(prefix="codex-prefill-")), model=args.model)
        address = engine.address
    try:
        with EngineClient(address) as client:
            info = client.model_info()
            counted = client.count_tokens(request)
            report = {
                "model": info.model_id,
                "context_length": info.context_length,
                "input_items": len(body["input"]),
                "engine_input_tokens": counted.input_tokens,
                "cold": measure(client, request),
                "repeat": measure(client, request),
            }
    finally:
        if engine is not None:
            engine.stop()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
