"""What one forward of the benchmark model costs on this machine: the floor under any engine.

Both servers in bench/batching.py run mlx-vlm's own language model, so a decode step of B rows
costs them the same forward; only prefill work and per-step overhead can differ. This measures
that forward directly (no engine): a decode step for B = 1, 2, 4, 8, 16 rows (batch KV cache of
--context positions), prefill of P prompt tokens in one row or eight, and how much of a decode
forward `mx.async_eval` blocks for (on the CPU backend it returns only near the end of the
forward, so a double-buffered loop hides little Python work behind it; on Metal it returns at once).

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m bench.forward_costs --out bench/results/forward-costs.json
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.bench_model import DEFAULT_DIR, build_bench_model


def decode_step(
    language: Any, token: Any, cache: list[Any], deltas: Any, blocked: list[float] | None = None
) -> None:
    """One decode forward; with `blocked`, also how long `mx.async_eval` took to return."""
    import mlx.core as mx

    logits = language(token, cache=cache, rope_deltas=deltas).logits
    started = time.perf_counter()
    mx.async_eval(logits)  # type: ignore[no-untyped-call]
    if blocked is not None:
        blocked.append(time.perf_counter() - started)
    mx.eval(logits)


def prefill_rows(language: Any, ids: Any, positions: Any) -> None:
    """One prefill forward of `ids` [rows, length] into fresh batch caches."""
    import mlx.core as mx
    from mlx_vlm.models.cache import BatchKVCache

    cache = [BatchKVCache([0] * ids.shape[0]) for _ in range(len(language.layers))]
    mx.eval(language(ids, cache=cache, position_ids=positions).logits)


def median_seconds(work: Callable[[], None], repeat: int) -> float:
    work()  # warm-up
    times = []
    for _ in range(repeat):
        started = time.perf_counter()
        work()
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--model-dir", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--context", type=int, default=64, help="positions already in the KV cache")
    parser.add_argument("--prompts", type=int, nargs="+", default=[21, 43, 256])
    parser.add_argument("--repeat", type=int, default=8)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)

    import mlx.core as mx
    from mlx_vlm import load  # type: ignore[attr-defined]
    from mlx_vlm.models.cache import BatchKVCache

    model_dir, parameters = build_bench_model(args.model_dir)
    model, _ = load(str(model_dir))
    language = model.language_model
    layers = len(language.layers)

    def positions(rows: int, length: int) -> Any:
        return mx.broadcast_to(mx.arange(length).reshape(1, 1, length), (3, rows, length))

    def filled_cache(rows: int) -> list[Any]:
        cache = [BatchKVCache([0] * rows) for _ in range(layers)]
        ids = mx.zeros((rows, args.context), dtype=mx.int32)
        mx.eval(language(ids, cache=cache, position_ids=positions(rows, args.context)).logits)
        return cache

    results: dict[str, Any] = {
        "model": f"random qwen2_vl, {parameters / 1e6:.0f}M parameters, float32",
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
        "load_average_at_start": os.getloadavg()[0],
        "openblas_preloaded": "openblas" in os.environ.get("LD_PRELOAD", ""),
        "decode_ms": {},
        "decode_async_eval_blocks_ms": {},
        "prefill_ms": {},
    }
    for rows in args.rows:
        cache = filled_cache(rows)
        token = mx.zeros((rows, 1), dtype=mx.int32)
        deltas = mx.zeros((rows, 1))
        step = functools.partial(decode_step, language, token, cache, deltas)
        results["decode_ms"][rows] = 1000 * median_seconds(step, args.repeat)
        blocked: list[float] = []
        median_seconds(functools.partial(step, blocked), args.repeat)
        results["decode_async_eval_blocks_ms"][rows] = 1000 * statistics.median(blocked)
        print(
            f"decode {rows:2d} rows: {results['decode_ms'][rows]:.1f} ms a step "
            f"({results['decode_ms'][rows] / rows:.1f} ms a row); async_eval returned after "
            f"{results['decode_async_eval_blocks_ms'][rows]:.1f} ms",
            flush=True,
        )
    for length in args.prompts:
        for rows in (1, 8):
            prefill = functools.partial(
                prefill_rows, language, mx.zeros((rows, length), dtype=mx.int32), positions(rows, length)
            )
            milliseconds = 1000 * median_seconds(prefill, max(2, args.repeat // 2))
            results["prefill_ms"][f"{rows}x{length}"] = milliseconds
            print(
                f"prefill {rows} x {length} tokens: {milliseconds:.0f} ms "
                f"({milliseconds / (rows * length):.2f} ms a token)",
                flush=True,
            )
    results["load_average_at_end"] = os.getloadavg()[0]
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
