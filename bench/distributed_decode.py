"""One process vs `--distributed tensor` over two ring ranks on this host: decode speed, side by side.

Builds the qwen3_vl_moe family fixture (or takes `--model`), starts a plain engine and asks it
`--requests` greedy requests one at a time, then does the same with two ranks on MLX's ring
backend over loopback TCP (the environment `mlx.launch` would set). Reports each request's
decode tokens/s from the engine's own timings. On one host the two ranks share its cores and
every step pays the all-reduces through TCP: this shows the cost of the mode, not a speed-up
(that needs a model too big for one host, on hosts joined by Thunderbolt).

    python bench/distributed_decode.py --requests 4 --max-output-tokens 64
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests._services import BIN, free_port, process_env, start_engine  # noqa: E402
from training.families import FAMILIES, build_family  # noqa: E402
from vlmserve.client import EngineClient  # noqa: E402
from vlmserve.engine.v1 import engine_pb2 as pb  # noqa: E402


def decode_rates(address: str, requests: int, max_tokens: int) -> list[float]:
    rates = []
    with EngineClient(address) as client:
        for index in range(requests):
            message = pb.Message(
                role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text=f"count to {index}"))]
            )
            result = client.generate_unary(
                pb.GenerateRequest(
                    messages=[message], sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0)
                )
            )
            rates.append(round(result.timings.decode_tokens_per_second, 1))
    return rates


def one_process(model: str, logs: Path, args: argparse.Namespace) -> list[float]:
    engine = start_engine(logs, model=model)
    try:
        return decode_rates(engine.address, args.requests, args.max_output_tokens)
    finally:
        engine.stop()


def two_ranks(model: str, logs: Path, args: argparse.Namespace) -> list[float]:
    hostfile = logs / "hosts.json"
    hostfile.write_text(json.dumps([[f"127.0.0.1:{free_port()}"], [f"127.0.0.1:{free_port()}"]]))
    ring = {"MLX_HOSTFILE": str(hostfile)}
    options = ("--distributed", "tensor")
    with (logs / "rank1.log").open("wb") as log:
        follower = subprocess.Popen(
            [str(BIN / "vlmserve-engine"), *options, "--model", model, "--address", "127.0.0.1:0"],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**process_env(), **ring, "MLX_RANK": "1"},
            cwd=REPO,
        )
    try:
        leader = start_engine(logs, model=model, extra=options, env={**ring, "MLX_RANK": "0"})
        try:
            return decode_rates(leader.address, args.requests, args.max_output_tokens)
        finally:
            leader.stop()
    finally:
        try:
            follower.wait(timeout=60)
        except subprocess.TimeoutExpired:
            follower.kill()
            follower.wait()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0], allow_abbrev=False)
    parser.add_argument("--model", help="a model mlx-vlm can shard (default: the qwen3_vl_moe fixture)")
    parser.add_argument("--requests", type=int, default=4)
    parser.add_argument("--max-output-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, help="write the JSON here too")
    args = parser.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    with tempfile.TemporaryDirectory(prefix="vlmserve-distributed-bench-") as work:
        logs = Path(work)
        model = args.model or str(build_family(FAMILIES["qwen3_vl_moe"], logs / "qwen3_vl_moe"))
        report: dict[str, Any] = {
            "model": model if args.model else "qwen3_vl_moe fixture",
            "host": {"machine": platform.machine(), "cores": os.cpu_count(), "load": os.getloadavg()},
            "max_output_tokens": args.max_output_tokens,
            "one_process_decode_tokens_per_s": one_process(model, logs, args),
            "two_ranks_decode_tokens_per_s": two_ranks(model, logs, args),
        }
    text = json.dumps(report, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
