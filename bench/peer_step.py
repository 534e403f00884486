"""B=1 greedy decode: our engine's step against vllm-mlx's, in one process, in turn.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m bench.peer_step [--tokens 128] [--rounds 5] [--out FILE]

Why a peer is ahead on a single stream (issue 37.3): vllm-mlx 0.6.0 (`--mllm
--continuous-batching`) serves a text-only chat request on a qwen2_vl checkpoint through its
`MLLMBatchGenerator`: mlx-vlm's own `language_model` (the same Python as ours; its
vllm_mlx.text_model_from_vlm extracts an mlx-lm model only for Qwen3.5 and Gemma 4), a one-row
`BatchKVCache` merged from mlx-lm's `KVCache` (the same class as mlx-vlm's), and per step
`_step` + `mx.async_eval(y, logprobs)` then the previous token's `tolist()`, inside
`mx.stream(new_stream)`. `vllm_step` below is that loop; `engine` is our in-process Generator
(no gRPC) on the same prompt ids; `forward` is the bare pipelined forward of bench/bandwidth.py.
Each way per round: decode tok/s and the CPU ms per token of the thread that drives MLX
(`CLOCK_THREAD_CPUTIME`, which a busy machine does not move), and whether the tokens match.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.bandwidth import forward_alone, keeping_dtype
from bench.bench_model import build_bench_model
from bench.speculative import request, run

PROMPT = "Write a long story about a lighthouse keeper and the storm that changed everything."


def _first(array: Any) -> int:
    values: list[int] = array.reshape(-1).tolist()
    return values[0]


def vllm_step(model: Any, prompt_ids: Sequence[int], tokens: int) -> tuple[float, float, list[int]]:
    """(decode tok/s, thread CPU ms per decode token, tokens) of vllm-mlx's MLLMBatchGenerator
    loop for one text-only row (vllm_mlx.mllm_batch_generator `_process_prompts`, `_next`, `_step`)."""
    import mlx.core as mx
    from mlx_vlm.models.cache import BatchKVCache, make_prompt_cache

    language_model = model.language_model
    stream = mx.new_stream(mx.default_device())
    with mx.stream(stream):
        cache = make_prompt_cache(language_model)
        output = language_model(mx.array([list(prompt_ids)], dtype=mx.int32), cache=cache)
        logits = output.logits[:, -1, :]
        y = mx.argmax(logits - mx.logsumexp(logits, axis=-1, keepdims=True), axis=-1)
        mx.eval(y)
        deltas = language_model._rope_deltas
        batch_cache = [BatchKVCache.merge([layer]) for layer in cache]  # type: ignore[no-untyped-call]
        kwargs = {"rope_deltas": mx.array(deltas).reshape(1, -1)} if deltas is not None else {}

        def step(previous: Any) -> tuple[Any, Any]:
            out = language_model(previous[:, None], cache=batch_cache, **kwargs)
            last = out.logits[:, -1, :]
            logprobs = last - mx.logsumexp(last, axis=-1, keepdims=True)
            return mx.argmax(logprobs, axis=-1), logprobs

        produced = [_first(y)]
        started, cpu = time.perf_counter(), time.thread_time()
        for index in range(tokens - 1):
            following, logprobs = step(y)
            mx.async_eval(following, logprobs)  # type: ignore[no-untyped-call]
            if index > 0:  # the first is the prefill's, read above
                produced.append(_first(y))
            y = following
        produced.append(_first(y))
        wall, cpu = time.perf_counter() - started, time.thread_time() - cpu
    return (tokens - 1) / wall, 1000 * cpu / (tokens - 1), produced


def engine_request(generator: Any, prepared: Any, tag: str) -> tuple[float, float, list[int]]:
    """(decode tok/s from the inter-token gaps, generation thread CPU ms per token, tokens)."""
    assert generator._thread is not None and generator._thread.ident is not None
    clock = time.pthread_getcpuclockid(generator._thread.ident)
    registry = generator.metrics.registry
    name = "vlmserve_engine_inter_token_latency_seconds"

    def gaps() -> tuple[float, float]:
        return (
            registry.get_sample_value(f"{name}_sum") or 0.0,
            registry.get_sample_value(f"{name}_count") or 0.0,
        )

    before, cpu = gaps(), time.clock_gettime(clock)
    run(generator, [prepared], tag)
    after, cpu = gaps(), time.clock_gettime(clock) - cpu
    report = next(r for r in generator.reports if r.request_id == f"{tag}-0")
    count = after[1] - before[1]
    return count / (after[0] - before[0]), 1000 * cpu / len(report.token_ids), list(report.token_ids)


def main(argv: Sequence[str] | None = None) -> None:
    from mlx_vlm.utils import load

    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args(argv)

    path, _ = build_bench_model()
    model, _ = load(str(path))
    generator = keeping_dtype(path, args.tokens)
    rounds: list[dict[str, Any]] = []
    try:
        prepared = request(generator, PROMPT, temperature=0.0, seed=0, max_tokens=args.tokens)
        ids = list(prepared.prompt_ids)
        engine_request(generator, prepared, "warm")
        vllm_step(model, ids, 8)
        for index in range(args.rounds):
            ways: dict[str, Any] = {}
            order = ["engine", "vllm_step", "forward"]
            if index % 2:
                order.reverse()
            for way in order:
                if way == "engine":
                    ways[way] = engine_request(generator, prepared, f"r{index}")
                elif way == "vllm_step":
                    ways[way] = vllm_step(model, ids, args.tokens)
                else:
                    tps, cpu = forward_alone(model, len(ids), args.tokens, pipelined=True)
                    ways[way] = (tps, cpu, [])
            row = {way: {"tok_s": v[0], "cpu_ms_per_token": v[1]} for way, v in ways.items()}
            row["same_tokens"] = ways["engine"][2] == ways["vllm_step"][2]
            row["engine_over_vllm_step"] = ways["engine"][0] / ways["vllm_step"][0]
            rounds.append(row)
            print(json.dumps(row), flush=True)
    finally:
        generator.stop()
    summary = {
        way: {key: statistics.median(r[way][key] for r in rounds) for key in ("tok_s", "cpu_ms_per_token")}
        for way in ("engine", "vllm_step", "forward")
    }
    result = {
        "prompt_tokens": len(ids),
        "tokens": args.tokens,
        "rounds": rounds,
        "median": summary,
        "median_engine_over_vllm_step": statistics.median(r["engine_over_vllm_step"] for r in rounds),
    }
    print(json.dumps(result["median"]), result["median_engine_over_vllm_step"])
    if args.out is not None:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
