"""Soak: concurrent screenshot requests oversubscribing the engine's memory budget (issue 37
item 4; docs/performance.md, "The vision tower's transient").

One real `vlmserve-engine` process on the fixture model, `--memory-budget-mib` set so the
requests' reservations (KV + image arrays + the vision transient, loop/vision_memory.py) add up to
`--oversubscription` x the budget, and a queue shorter than the crowd. Each round sends
`--concurrent` requests at once, each with one large screenshot. Reported: crashes (the engine
process gone, or an error other than RESOURCE_EXHAUSTED), how many finished, how many were
refused and whether each refusal carried a retry delay (gRPC RetryInfo, which the facade turns
into a 429 with Retry-After), and the engine's peak RSS growth above idle (the kernel's VmHWM)
against the budget (+10 %).

The fixture's processor sizes every image to 16 image tokens (its pixel budget), so the transient
per request is about 8 MiB here; on a real model the same screenshot costs hundreds of MiB.

    nice -n 10 .venv/bin/python bench/vision_memory_soak.py --rounds 3 \\
        --out bench/results/vision-memory-soak.json
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: reach tests/ helpers without installing them

import grpc  # noqa: E402

from bench.batching import peak_rss_mib  # noqa: E402
from tests._fixture_models import RANDOM_MODEL_PATH  # noqa: E402
from tests._services import start_engine  # noqa: E402
from tests.engine.test_request_prep import big_png  # noqa: E402
from vlmserve.client import channel_options  # noqa: E402
from vlmserve.engine.v1 import engine_pb2 as pb  # noqa: E402
from vlmserve.engine.v1 import engine_pb2_grpc as pb_grpc  # noqa: E402

# One request's reservation on the fixture (KV 1,536 bytes a token x (53 + 64) tokens, 0.3 MiB of
# arrays, 8.1 MiB of vision transient), rounded up; the budget is set from it.
RESERVATION_MIB = 8.6


def send(stub: pb_grpc.EngineServiceStub, image: bytes, index: int, max_tokens: int) -> dict[str, Any]:
    request = pb.GenerateRequest(
        messages=[
            pb.Message(
                role=pb.ROLE_USER,
                parts=[
                    pb.Part(image=pb.ImagePart(data=image, media_type="image/png")),
                    pb.Part(text=pb.TextPart(text=f"Screen {index}: what is on it?")),
                ],
            )
        ],
        sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0),
    )
    try:
        stub.GenerateUnary(pb.GenerateUnaryRequest(request=request), timeout=600)
        return {"outcome": "done"}
    except grpc.RpcError as error:
        trailers = dict(error.trailing_metadata() or ())  # type: ignore[attr-defined]
        return {
            "outcome": error.code().name,  # type: ignore[attr-defined]
            "retry_info": "grpc-status-details-bin" in trailers,
        }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--concurrent", type=int, default=16)
    parser.add_argument("--oversubscription", type=float, default=1.2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--side", type=int, default=2000, help="the screenshot's side in pixels")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    budget_mib = max(1, int(args.concurrent * RESERVATION_MIB / args.oversubscription))
    engine = start_engine(
        Path(tempfile.mkdtemp(prefix="vision-soak-")),
        model=str(RANDOM_MODEL_PATH),
        extra=(
            "--memory-budget-mib",
            str(budget_mib),
            "--max-active",
            str(args.concurrent),
            "--max-queue",
            str(args.concurrent // 2),
            "--no-warmup",
        ),
    )
    image = big_png(args.side)
    outcomes: list[dict[str, Any]] = []
    started = time.monotonic()
    try:
        pid = engine.process.pid
        with grpc.insecure_channel(engine.address, options=channel_options()) as channel:
            stub = pb_grpc.EngineServiceStub(channel)
            send(stub, image, -1, 2)  # one-off allocations, before measuring
            idle, _ = peak_rss_mib(pid)
            Path(f"/proc/{pid}/clear_refs").write_text("5")  # VmHWM restarts from the current RSS
            for _ in range(args.rounds):
                with ThreadPoolExecutor(args.concurrent) as pool:
                    outcomes += pool.map(
                        lambda i: send(stub, image, i, args.max_tokens), range(args.concurrent)
                    )
            _, peak = peak_rss_mib(pid)
        alive = engine.process.poll() is None
    finally:
        engine.stop()
    counts: dict[str, int] = {}
    for outcome in outcomes:
        counts[outcome["outcome"]] = counts.get(outcome["outcome"], 0) + 1
    refused = [o for o in outcomes if o["outcome"] == "RESOURCE_EXHAUSTED"]
    report = {
        "bench": "vision_memory_soak",
        "concurrent": args.concurrent,
        "rounds": args.rounds,
        "oversubscription": args.oversubscription,
        "budget_mib": budget_mib,
        "screenshot": f"{args.side}x{args.side} PNG",
        "outcomes": counts,
        "refused_with_retry_info": sum(1 for o in refused if o["retry_info"]),
        "crashes": int(not alive)
        + sum(v for k, v in counts.items() if k not in ("done", "RESOURCE_EXHAUSTED")),
        "idle_rss_mib": round(idle, 1),
        "peak_growth_mib": round(peak - idle, 1),
        "peak_within_budget_plus_10pct": peak - idle <= budget_mib * 1.1,
        "wall_s": round(time.monotonic() - started, 1),
    }
    print(json.dumps(report, indent=1))
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
