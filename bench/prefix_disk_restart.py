"""An agent's next turn after an engine restart, served from the prefix cache's disk tier
(docs/performance.md, "The prefix cache on disk").

Three engines, each a real `vlmserve-engine` process on the fixture model (or --model), measured
on the same turn-2 request (turn 1's prompt, its answer and a new user message):

* `cold`: a fresh engine, no disk tier: turn 2 computes its whole prompt;
* `warm`: the engine that just served turn 1 (the in-memory prefix cache has it);
* `restart`: an engine with `--prefix-cache-dir` served turn 1 and was stopped (SIGTERM: the
  cache is written at shutdown); a new engine on the same folder serves turn 2;
* `restart_primed` (`--primed`): as `restart` (a copy of the same folder), but the new engine
  first serves turn 1 under another partition (a whole prefill, no hit), as the warm engine did
  before its turn 2: the first long prompt a process runs pays one-time costs (MLX's compiled
  functions traced for new shapes) that `warm` has behind it and `restart` does not.

Each engine's start-up (process start to SERVING, its warm-up included) is timed (`start_s`).
`--openblas-threads N` sets OPENBLAS_NUM_THREADS for every engine (see docs/performance.md: on
an oversubscribed CPU machine, OpenBLAS's worker threads are what a fresh process's first turn
waits for).

Rounds alternate the three. Reports time to first token (the engine's own figure) per case, and
restart ÷ warm (goal ≤ 1.5) and restart ÷ cold (the saving).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        .venv/bin/python bench/prefix_disk_restart.py --rounds 3 --history-chars 60000 \\
        --out bench/results/prefix-disk-restart.json

`--codex` uses the recorded Codex turn padded to ~19k OpenAI tokens (bench/codex_prefill.py) as
turn 1 instead of the synthetic agent history (a cold prefill takes minutes on a CPU).
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: reach tests/ helpers without installing them

from tests._services import start_engine as start_service  # noqa: E402
from vlmserve.client import EngineClient  # noqa: E402
from vlmserve.engine.v1 import engine_pb2 as pb  # noqa: E402


def screenshot_png() -> bytes:
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (448, 448), (240, 240, 240))
    draw = ImageDraw.Draw(image)
    for i in range(12):
        draw.rectangle((20 + i * 30, 40 + i * 20, 60 + i * 30, 80 + i * 20), fill=(i * 20, 90, 200 - i * 10))
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def agent_turns(history_chars: int) -> tuple[pb.GenerateRequest, pb.GenerateRequest]:
    """Turn 1 (system prompt, tool-output history with a screenshot) and turn 2 (turn 1 + answer
    + a new question)."""
    system = "You are a coding agent. " + " ".join(
        f"Rule {i}: keep edits small and tested." for i in range(80)
    )
    log_lines: list[str] = []
    size = 0
    while size < history_chars:
        line = f"$ pytest tests/unit/test_{len(log_lines)}.py -q\n.... {len(log_lines) * 7 % 97} passed\n"
        log_lines.append(line)
        size += len(line)
    user = [
        pb.Part(text=pb.TextPart(text="Here is the test log and the screen:\n" + "".join(log_lines))),
        pb.Part(image=pb.ImagePart(data=screenshot_png(), media_type="image/png")),
    ]
    first = [
        pb.Message(role=pb.ROLE_SYSTEM, parts=[pb.Part(text=pb.TextPart(text=system))]),
        pb.Message(role=pb.ROLE_USER, parts=user),
    ]
    second = [
        *first,
        pb.Message(role=pb.ROLE_ASSISTANT, parts=[pb.Part(text=pb.TextPart(text="All tests pass."))]),
        pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text="Now run the linter."))]),
    ]
    # Turn 1 answers (a request that ends in its prefill leaves no KV to keep); turn 2 is timed
    # to its first token.
    return (
        pb.GenerateRequest(
            messages=first, sampling=pb.SamplingParams(max_tokens=8, temperature=0.0), partition_key="bench"
        ),
        pb.GenerateRequest(
            messages=second, sampling=pb.SamplingParams(max_tokens=1, temperature=0.0), partition_key="bench"
        ),
    )


def codex_turns() -> tuple[pb.GenerateRequest, pb.GenerateRequest]:
    from tests.codex.codex_requests import load_recorded, pad_history
    from vlmserve.responses import build_generate_request

    body = pad_history(load_recorded(), 70_000, chunk_chars=3_000)
    first = build_generate_request(body).request
    body["input"].append({"role": "user", "content": "Now run the linter."})
    second = build_generate_request(body).request
    for request, tokens in ((first, 8), (second, 1)):
        request.sampling.max_tokens = tokens
        request.partition_key = "bench"
    return first, second


def ttft(address: str, request: pb.GenerateRequest) -> dict[str, Any]:
    with EngineClient(address) as client:
        result = client.generate_unary(request, timeout=3600)
    return {
        "ttft_s": round(result.timings.time_to_first_token_seconds, 4),
        "input_tokens": result.usage.input_tokens,
        "cached_tokens": result.usage.cached_tokens,
    }


def one_round(
    logs: Path,
    model: str | None,
    turns: tuple[pb.GenerateRequest, pb.GenerateRequest],
    primed: bool,
    env: dict[str, str],
) -> dict[str, Any]:
    first, second = turns
    out: dict[str, Any] = {"start_s": []}

    def start_engine(logs: Path, *, model: str | None, extra: tuple[str, ...] = ()) -> Any:
        started = time.perf_counter()
        engine = start_service(logs, model=model, extra=extra, env=env)
        out["start_s"].append(round(time.perf_counter() - started, 3))
        return engine

    cold = start_engine(logs, model=model)
    try:
        out["cold"] = ttft(cold.address, second)
    finally:
        cold.stop()
    warm = start_engine(logs, model=model)
    try:
        out["turn1"] = ttft(warm.address, first)
        out["warm"] = ttft(warm.address, second)
    finally:
        warm.stop()
    folder = Path(tempfile.mkdtemp(prefix="prefix-disk-"))
    flags = ("--prefix-cache-dir", str(folder))
    try:
        before = start_engine(logs, model=model, extra=flags)
        try:
            ttft(before.address, first)
        finally:
            stopped = time.perf_counter()
            before.stop()  # SIGTERM: the cache is written at shutdown
            out["stop_s"] = round(time.perf_counter() - stopped, 3)
        out["disk_bytes"] = sum(p.stat().st_size for p in folder.rglob("*.safetensors"))
        if primed:
            shutil.copytree(folder, folder.with_name(folder.name + "-primed"))
        after = start_engine(logs, model=model, extra=flags)
        try:
            out["restart"] = ttft(after.address, second)
        finally:
            after.stop()
        if primed:
            copy = folder.with_name(folder.name + "-primed")
            engine = start_engine(logs, model=model, extra=("--prefix-cache-dir", str(copy)))
            try:
                other = pb.GenerateRequest()
                other.CopyFrom(first)
                other.partition_key = "another"
                ttft(engine.address, other)
                out["restart_primed"] = ttft(engine.address, second)
            finally:
                engine.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        shutil.rmtree(folder.with_name(folder.name + "-primed"), ignore_errors=True)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--model", default=None)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--history-chars", type=int, default=60_000)
    parser.add_argument("--codex", action="store_true", help="the recorded Codex turn (~24k engine tokens)")
    parser.add_argument("--primed", action="store_true", help="also `restart_primed` (see above)")
    parser.add_argument(
        "--openblas-threads", type=int, default=None, help="OPENBLAS_NUM_THREADS for the engines"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    turns = codex_turns() if args.codex else agent_turns(args.history_chars)
    logs = Path(tempfile.mkdtemp(prefix="prefix-disk-bench-"))
    env = {} if args.openblas_threads is None else {"OPENBLAS_NUM_THREADS": str(args.openblas_threads)}
    rounds = [one_round(logs, args.model, turns, args.primed, env) for _ in range(args.rounds)]
    cases = ("cold", "warm", "restart", *(("restart_primed",) if args.primed else ()))

    def median(case: str) -> float:
        return float(statistics.median(r[case]["ttft_s"] for r in rounds))

    summary = {
        "load": os.getloadavg(),
        "uptime": subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip(),
        "env": env,
        "start_s": statistics.median(s for r in rounds for s in r["start_s"]),
        "input_tokens": rounds[0]["cold"]["input_tokens"],
        "cached_tokens_after_restart": [r["restart"]["cached_tokens"] for r in rounds],
        "ttft_s": {case: median(case) for case in cases},
        "restart_over_warm": round(median("restart") / median("warm"), 3),
        **(
            {"restart_primed_over_warm": round(median("restart_primed") / median("warm"), 3)}
            if args.primed
            else {}
        ),
        "restart_over_cold": round(median("restart") / median("cold"), 3),
        "disk_bytes": rounds[0]["disk_bytes"],
        "rounds": rounds,
    }
    text = json.dumps(summary, indent=1)
    print(text)
    if args.out is not None:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
