"""Memory an idle engine gives back (`--load lazy --idle-unload-seconds`), measured on a real
engine process serving the 144M float32 benchmark model (bench/bench_model.py).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        .venv/bin/python -m bench.model_unload_memory --out bench/results/model-unload-memory.json

The engine's resident memory (VmRSS from /proc) is read: after a lazy start (no weights), after
the first requests (weights loaded, KV and vision caches filled), after the idle unload, after the
next request (reloaded), and, for comparison, after an eager start. The engine's own log line at
each unload gives MLX's active and cache memory before and after (model_lifecycle.py).
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.bench_model import DEFAULT_DIR, build_bench_model
from tests._services import ServiceProcess, start_engine
from vlmserve.client import EngineClient
from vlmserve.engine.v1 import engine_pb2 as pb

IDLE_S = 3.0


def rss_mib(process: ServiceProcess) -> float:
    status = Path(f"/proc/{process.process.pid}/status").read_text()
    match = re.search(r"VmRSS:\s+(\d+) kB", status)
    assert match is not None
    return int(match[1]) / 1024


def request(text: str) -> pb.GenerateRequest:
    return pb.GenerateRequest(
        messages=[pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text=text * 40))])],
        sampling=pb.SamplingParams(max_tokens=16, temperature=0.0),
    )


def wait_weights(client: EngineClient, state: pb.WeightsState.ValueType, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while client.model_info().weights != state:
        if time.monotonic() > deadline:
            raise TimeoutError(pb.WeightsState.Name(state))
        time.sleep(0.2)


def measure(model: Path, logs: Path) -> dict[str, Any]:
    figures: dict[str, Any] = {}
    eager = start_engine(logs, model=str(model))
    try:
        figures["eager_start_mib"] = rss_mib(eager)
    finally:
        eager.stop()
    engine = start_engine(
        logs, model=str(model), extra=("--load", "lazy", "--idle-unload-seconds", str(IDLE_S))
    )
    try:
        with EngineClient(engine.address) as client:
            figures["lazy_start_mib"] = rss_mib(engine)
            started = time.perf_counter()
            client.generate_unary(request("first "))
            figures["first_request_s"] = time.perf_counter() - started
            for word in ("second ", "third "):
                client.generate_unary(request(word))
            figures["loaded_mib"] = rss_mib(engine)
            wait_weights(client, pb.WEIGHTS_STATE_UNLOADED, timeout=IDLE_S + 60)
            time.sleep(0.5)
            figures["unloaded_mib"] = rss_mib(engine)
            started = time.perf_counter()
            client.generate_unary(request("first "))
            figures["reload_request_s"] = time.perf_counter() - started
            figures["reloaded_mib"] = rss_mib(engine)
        figures["engine_log"] = [
            line.split("] ", 1)[-1]
            for line in engine.log().splitlines()
            if "weights loaded in" in line or "weights unloaded" in line
        ]
    finally:
        engine.stop()
    return figures


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--model", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    model, parameters = build_bench_model(args.model)
    with tempfile.TemporaryDirectory() as logs:
        figures = {"model": str(model), "parameters": parameters, **measure(model, Path(logs))}
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
