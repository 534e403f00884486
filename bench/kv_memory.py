"""Peak engine memory under 16 concurrent long requests, with and without quantized KV
(docs/performance.md, "Quantized KV"; issue 22 item 4).

For each KV precision (full, `--kv-bits 8`, `--kv-bits 4`, and turboquant 4-bit), one real
`vlmserve-engine` process on the 144M benchmark model (bench/bench_model.py; head dimension 64)
serves N concurrent requests, each a prompt of its own of about `--prompt-tokens` tokens and
`--max-tokens` greedy output tokens, all admitted at once (`--max-active N`). Reported per
precision: the engine's peak RSS (`VmHWM` from /proc, the kernel's own high-water mark), its RSS
after loading (idle), the difference (what the requests cost), and the wall time. The order of the
precisions alternates between rounds.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        .venv/bin/python bench/kv_memory.py --out bench/results/kv-memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: reach tests/ helpers without installing them

from bench.batching import peak_rss_mib  # noqa: E402
from bench.bench_model import DEFAULT_DIR, build_bench_model  # noqa: E402
from tests._services import start_engine  # noqa: E402
from vlmserve.client import EngineClient  # noqa: E402
from vlmserve.engine.v1 import engine_pb2 as pb  # noqa: E402

PRECISIONS: dict[str, tuple[str, ...]] = {
    "full": (),
    "8-bit": ("--kv-bits", "8"),
    "4-bit": ("--kv-bits", "4"),
    "4-bit turboquant": ("--kv-bits", "4", "--kv-quant-scheme", "turboquant"),
}


def request(index: int, prompt_tokens: int, max_tokens: int) -> pb.GenerateRequest:
    # The fixture tokenizer spends about one token per character of these words and digits.
    words, size = [], 0
    while size < prompt_tokens:
        word = f"item{index}-{len(words)} "
        words.append(word)
        size += len(word) // 2
    text = "".join(words) + "Summarize."
    return pb.GenerateRequest(
        messages=[pb.Message(role=pb.ROLE_USER, parts=[pb.Part(text=pb.TextPart(text=text))])],
        sampling=pb.SamplingParams(max_tokens=max_tokens, temperature=0.0),
    )


def one(model: Path, flags: tuple[str, ...], args: argparse.Namespace, logs: Path) -> dict[str, Any]:
    extra = (
        *flags,
        "--max-active",
        str(args.concurrent),
        "--max-queue",
        str(args.concurrent * 2),
        "--prefix-cache-mib",
        "0",
        "--no-warmup",
    )
    engine = start_engine(logs, model=str(model), extra=extra)
    try:
        pid = engine.process.pid
        idle, _ = peak_rss_mib(pid)
        started = time.perf_counter()
        with EngineClient(engine.address) as client, ThreadPoolExecutor(args.concurrent) as pool:
            results = list(
                pool.map(
                    lambda i: client.generate_unary(
                        request(i, args.prompt_tokens, args.max_tokens), timeout=3600
                    ),
                    range(args.concurrent),
                )
            )
        wall = time.perf_counter() - started
        _, peak = peak_rss_mib(pid)
    finally:
        engine.stop()
    return {
        "idle_rss_mib": round(idle, 1),
        "peak_rss_mib": round(peak, 1),
        "requests_mib": round(peak - idle, 1),
        "wall_s": round(wall, 2),
        "input_tokens": sum(r.usage.input_tokens for r in results),
        "output_tokens": sum(r.usage.output_tokens for r in results),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument("--model", type=Path, default=None, help="default: the 144M benchmark model")
    parser.add_argument("--concurrent", type=int, default=16)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--max-tokens", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    model = args.model
    if model is None:
        model = DEFAULT_DIR if (DEFAULT_DIR / "config.json").exists() else build_bench_model()[0]
    logs = Path(tempfile.mkdtemp(prefix="kv-memory-"))
    rounds: list[dict[str, Any]] = []
    names = list(PRECISIONS)
    for number in range(args.rounds):
        order = names if number % 2 == 0 else names[::-1]
        rounds.append({name: one(model, PRECISIONS[name], args, logs) for name in order})
        print(json.dumps(rounds[-1]), flush=True)
    summary = {
        name: {
            "peak_rss_mib": min(r[name]["peak_rss_mib"] for r in rounds),
            "requests_mib": min(r[name]["requests_mib"] for r in rounds),
        }
        for name in names
    }
    base = summary["full"]["requests_mib"]
    for name in names:
        summary[name]["requests_vs_full"] = round(summary[name]["requests_mib"] / base, 3) if base else None
    report = {
        "load": os.getloadavg(),
        "model": str(model),
        "concurrent": args.concurrent,
        "prompt_tokens": args.prompt_tokens,
        "max_tokens": args.max_tokens,
        "summary": summary,
        "rounds": rounds,
    }
    text = json.dumps(report, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
