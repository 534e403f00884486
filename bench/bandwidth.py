"""Close to the limit (issue 37.2): B=1 decode against this machine's memory bandwidth, and a long
prompt's prefill against in-process mlx_vlm.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m bench.bandwidth [--dtypes float32 bfloat16 q4] [--tokens 64] [--prompt-words 2048]
            [--repeats 5] [--rounds 3] [--out bench/results/bandwidth.json]

1. Bandwidth: a plain streaming copy of a 256 MiB float32 array (numpy `copyto`; mlx `x * 1`
   evaluated), best of N, counting the bytes read and written (STREAM's "copy"); and a streaming
   read (mlx `sum`), the bytes read. The decode ceiling uses the copy figure.
2. The decode step's bytes read for the 144M random qwen2_vl (bench/bench_model.py) in float32,
   bfloat16 and 4-bit (mlx_vlm.convert, group 64): the language model's weights (the embedding
   table's one row, the output head whole) plus the KV cache at the context's length.
3. B=1 decode tok/s, three ways, `--rounds` times in turn (medians; the engine ÷ the pipelined
   forward paired by round: a busy machine's load moves between rounds): the model forward alone
   (a loop of `language_model` + argmax, `mx.eval` each step: what mlx can do), the same
   pipelined (`mx.async_eval` of the next step before reading this one, as mlx-lm does), and our
   engine (an in-process Generator, one request, greedy, on a prompt as long as the forward's:
   inter-token gaps from its metrics; no gRPC). Each as tok/s × bytes/step ÷ the copy bandwidth.
   Where the engine's step goes (bench/step_phases.py): ms per step building the forward's
   graph, waiting for the device, sampling, detokenising, assembling the output (stop sequences,
   tool calls), handing events over, the runner's bookkeeping and the loop around the step; the
   MLX calls per step (token reads, evals); and the CPU time per token of the thread that drives
   MLX, the engine's generation thread against the forward loop's: the load-proof measure of
   what the engine adds per step.
4. Prefill: a prompt of `--prompt-words` words (its tokens are reported), time to first token in
   our engine (submitted to done with max_tokens 1; a fresh prompt each, so no prefix reuse)
   against mlx_vlm's `stream_generate` in-process on the same chat-templated text (its first
   yield), `--repeats` // 2 rounds (at least 2) with the sides in turn: best of each, the median
   of the rounds' ratios, and the same for the process's CPU time (the work, load aside).
   `--dtypes` with no value runs only this and the bandwidth.

bench/stack_cpu.py measures what the served path (facade, the engine's gRPC side) costs a token.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.bench_model import DEFAULT_DIR, build_bench_model

COPY_BYTES = 256 << 20
VARIANTS = {"float32": None, "bfloat16": "/tmp/vlmserve-bench-144m-bf16", "q4": "/tmp/vlmserve-bench-144m-q4"}


def bandwidth(repeats: int) -> dict[str, float]:
    """GB/s: numpy and mlx copies (read + write), mlx streaming read, best of `repeats`."""
    import mlx.core as mx
    import numpy as np

    count = COPY_BYTES // 4
    source = np.ones(count, dtype=np.float32)
    target = np.empty_like(source)
    best: dict[str, float] = {"numpy_copy": 0.0, "mlx_copy": 0.0, "mlx_read": 0.0}
    array = mx.ones((count,), dtype=mx.float32)
    mx.eval(array)
    for _ in range(repeats):
        started = time.perf_counter()
        np.copyto(target, source)
        best["numpy_copy"] = max(best["numpy_copy"], 2 * COPY_BYTES / (time.perf_counter() - started) / 1e9)
        started = time.perf_counter()
        copied = array * 1
        mx.eval(copied)
        best["mlx_copy"] = max(best["mlx_copy"], 2 * COPY_BYTES / (time.perf_counter() - started) / 1e9)
        del copied
        started = time.perf_counter()
        mx.eval(mx.sum(array))
        best["mlx_read"] = max(best["mlx_read"], COPY_BYTES / (time.perf_counter() - started) / 1e9)
    return best


def variant_path(name: str, base: Path) -> Path:
    """The 144M model as `name` (converted once with mlx_vlm.convert)."""
    target = VARIANTS[name]
    if target is None:
        return base
    path = Path(target)
    if not (path / "config.json").is_file():
        from mlx_vlm.convert import convert

        if name == "q4":
            convert(str(base), str(path), quantize=True, q_bits=4, q_group_size=64)
        else:
            convert(str(base), str(path), dtype=name)
    return path


def step_bytes(language_model: Any, context: int) -> dict[str, int]:
    """Bytes one decode step reads: weights (the embedding's one row) and the KV at `context`."""
    from mlx.utils import tree_flatten

    weights = 0
    embedding = 0
    parameters: list[tuple[str, Any]] = tree_flatten(language_model.parameters())  # type: ignore[assignment]
    for name, value in parameters:
        if "embed_tokens" in name:
            embedding += value.nbytes
        else:
            weights += value.nbytes
    args = language_model.args if hasattr(language_model, "args") else language_model.config
    vocab = int(args.vocab_size)
    tied = bool(getattr(args, "tie_word_embeddings", False))
    # An untied head is among the weights; a tied one reads the embedding table whole.
    weights += embedding if tied else embedding // vocab
    layers = int(args.num_hidden_layers)
    kv_heads = int(args.num_key_value_heads)
    head_dim = int(getattr(args, "head_dim", None) or args.hidden_size // args.num_attention_heads)
    dtype_bytes = 2 if "16" in str(language_model.model.norm.weight.dtype) else 4
    kv = 2 * layers * kv_heads * head_dim * context * dtype_bytes
    return {"weights": weights, "kv": kv, "total": weights + kv}


def forward_alone(model: Any, prompt: int, tokens: int, *, pipelined: bool) -> tuple[float, float]:
    """(decode tok/s, the driving thread's CPU ms per token) of the language model alone (greedy),
    after a `prompt`-token prefill."""
    import mlx.core as mx
    from mlx_vlm.models.cache import make_prompt_cache

    language_model = model.language_model
    cache = make_prompt_cache(language_model)
    output = language_model(mx.array([[5] * prompt], dtype=mx.int32), cache=cache)
    token = mx.argmax(output.logits[:, -1, :], axis=-1)
    mx.eval(token)

    def step(previous: Any) -> Any:
        logits = language_model(previous.reshape(1, 1), cache=cache).logits
        return mx.argmax(logits[:, -1, :], axis=-1)

    started, cpu = time.perf_counter(), time.thread_time()
    if pipelined:
        following = step(token)
        mx.async_eval(following)  # type: ignore[no-untyped-call]
        for _ in range(tokens - 1):
            current, following = following, step(following)
            mx.async_eval(following)  # type: ignore[no-untyped-call]
            current.item()
        following.item()
    else:
        for _ in range(tokens):
            token = step(token)
            mx.eval(token)
    return tokens / (time.perf_counter() - started), 1000 * (time.thread_time() - cpu) / tokens


def keeping_dtype(path: Path, max_tokens: int) -> Any:
    """An in-process engine on `path` with its weights as stored (`--dtype keep`: auto would cast
    half precision to float32 on this CPU), speculation off."""
    from vlmserve.engine.config import EngineConfig
    from vlmserve.engine.loop.generator import Generator

    config = EngineConfig(
        model=str(path),
        max_output_tokens=max_tokens,
        prefix_cache_min_tokens=0,
        speculative="off",
        dtype="keep",
    )
    generator = Generator(config)
    generator.start()
    if not generator.ready.wait(600):
        raise RuntimeError(f"engine did not load: {generator.load_error}")
    return generator


def decode_rounds(path: Path, model: Any, prompt_text: str, tokens: int, rounds: int) -> dict[str, Any]:
    """B=1 greedy decode, the forward alone (synchronous and pipelined, on a prompt as long as
    the engine's) and our engine (one request on an in-process Generator: tok/s from its
    inter-token gaps, its step's phases from bench/step_phases.py), `rounds` times in turn: a
    busy machine's load moves between rounds, so each is compared with its own round."""
    from bench.speculative import request, run
    from bench.step_phases import StepPhases

    generator = keeping_dtype(path, tokens)
    try:
        run(generator, [request(generator, "warm up", temperature=0.0, seed=0, max_tokens=4)], "warm")
        prepared = request(generator, prompt_text, temperature=0.0, seed=0, max_tokens=tokens)
        context = len(prepared.prompt_ids)
        registry = generator.metrics.registry

        def gaps() -> tuple[float, float]:
            name = "vlmserve_engine_inter_token_latency_seconds"
            return (
                registry.get_sample_value(f"{name}_sum") or 0.0,
                registry.get_sample_value(f"{name}_count") or 0.0,
            )

        measured: dict[str, list[float]] = {
            key: []
            for key in ("forward_alone", "forward_pipelined", "engine", "forward_cpu_ms", "engine_cpu_ms")
        }
        phases: list[dict[str, Any]] = []
        for index in range(rounds):
            alone, _ = forward_alone(model, context, tokens, pipelined=False)
            pipelined, forward_cpu = forward_alone(model, context, tokens, pipelined=True)
            before = gaps()
            timers = StepPhases()
            with timers.watching():
                run(generator, [prepared], f"decode{index}")
            after = gaps()
            step = timers.per_step()
            phases.append(step)
            for key, value in (
                ("forward_alone", alone),
                ("forward_pipelined", pipelined),
                ("engine", (after[1] - before[1]) / (after[0] - before[0])),
                ("forward_cpu_ms", forward_cpu),
                ("engine_cpu_ms", step["generation_thread_cpu_ms_per_step"]),
            ):
                measured[key].append(value)
        return {"context_tokens": context, "rounds": measured, "engine_phases": phases}
    finally:
        generator.stop()


def decode_summary(measured: dict[str, list[float]], phases: list[dict[str, Any]]) -> dict[str, Any]:
    """Medians over the rounds: tok/s each way, the engine ÷ the pipelined forward (paired by
    round), the thread CPU per token, and the engine step's phases (ms per step, calls per step)."""
    median = statistics.median
    ratios = [e / p for e, p in zip(measured["engine"], measured["forward_pipelined"], strict=True)]
    return {
        "tok_per_s_median": {
            key: median(measured[key]) for key in ("forward_alone", "forward_pipelined", "engine")
        },
        "engine_over_pipelined_forward_median": median(ratios),
        "driving_thread_cpu_ms_per_token_median": {
            "forward_pipelined": median(measured["forward_cpu_ms"]),
            "engine_generation_thread": median(measured["engine_cpu_ms"]),
        },
        "engine_ms_per_step_median": {
            name: median(step["ms_per_step"].get(name, 0.0) for step in phases)
            for name in sorted({name for step in phases for name in step["ms_per_step"]})
        },
        "engine_calls_per_step": phases[-1]["calls_per_step"],
    }


def prefill(path: Path, prompt_text: str, repeats: int) -> dict[str, Any]:
    """Time to first token of a long prompt: our engine (submitted to done, max_tokens 1) against
    mlx_vlm's in-process stream_generate (its first yield) on the same chat-templated text, a
    fresh prompt each (no prefix reuse), `repeats` rounds, the two sides in turn (the order
    flipping each round); wall seconds and the process's CPU seconds (the work, whatever the
    load) of each."""
    from mlx_vlm.generate import stream_generate
    from mlx_vlm.prompt_utils import apply_chat_template
    from mlx_vlm.utils import load

    from bench.speculative import request, run

    model, processor = load(str(path))
    generator = keeping_dtype(path, 1)
    measured: dict[str, list[float]] = {"ours_s": [], "mlx_vlm_s": [], "ours_cpu_s": [], "mlx_vlm_cpu_s": []}

    def ours(index: int) -> None:
        # Its preparation (template, tokens) timed too, as stream_generate's is.
        started, cpu = time.perf_counter(), time.process_time()
        prepared = request(generator, f"{index} {prompt_text}", temperature=0.0, seed=0, max_tokens=1)
        run(generator, [prepared], f"p{index}")
        measured["ours_s"].append(time.perf_counter() - started)
        measured["ours_cpu_s"].append(time.process_time() - cpu)

    def theirs(index: int) -> None:
        rendered: Any = apply_chat_template(processor, model.config, f"{index} {prompt_text}", num_images=0)
        started, cpu = time.perf_counter(), time.process_time()
        for _ in stream_generate(model, processor, rendered, max_tokens=1):  # type: ignore[arg-type]
            break
        measured["mlx_vlm_s"].append(time.perf_counter() - started)
        measured["mlx_vlm_cpu_s"].append(time.process_time() - cpu)

    try:
        for index in range(repeats):
            for side in (ours, theirs) if index % 2 == 0 else (theirs, ours):
                side(index)
        reports = generator.reports
        tokens = reports[-1].prompt_tokens if reports else 0
    finally:
        generator.stop()
    ratios = [a / b for a, b in zip(measured["ours_s"], measured["mlx_vlm_s"], strict=True)]
    cpu_ratios = [a / b for a, b in zip(measured["ours_cpu_s"], measured["mlx_vlm_cpu_s"], strict=True)]
    return {
        "prompt_tokens": tokens,
        "ours_s": min(measured["ours_s"]),
        "mlx_vlm_s": min(measured["mlx_vlm_s"]),
        "ratio_median_paired": statistics.median(ratios),
        "cpu_ratio_median_paired": statistics.median(cpu_ratios),
        "rounds": measured,
    }


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0], allow_abbrev=False)
    parser.add_argument(
        "--dtypes", nargs="*", choices=tuple(VARIANTS), default=list(VARIANTS), help="none: no decode rows"
    )
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument(
        "--context", type=int, default=32, help="about this many prompt tokens before the decode"
    )
    parser.add_argument("--prompt-words", type=int, default=2048, help="the prefill prompt's length in words")
    parser.add_argument("--repeats", type=int, default=5, help="bandwidth copies and prefills (best of)")
    parser.add_argument("--rounds", type=int, default=3, help="decode rounds, each way in turn (median)")
    parser.add_argument("--out", type=Path, default=Path("bench/results/bandwidth.json"))
    args = parser.parse_args(argv)
    from mlx_vlm.utils import load

    base = build_bench_model(DEFAULT_DIR)[0]
    results: dict[str, Any] = {
        "load_average_before": os.getloadavg(),
        "bandwidth_GBps": bandwidth(args.repeats),
    }
    ceiling = results["bandwidth_GBps"]["numpy_copy"] * 1e9
    print("bandwidth GB/s", {k: round(v, 1) for k, v in results["bandwidth_GBps"].items()}, flush=True)
    decode_text = "Describe the sea " * max(1, args.context // 4)
    for name in args.dtypes:
        path = variant_path(name, base)
        model, _ = load(str(path))
        decoded = decode_rounds(path, model, decode_text, args.tokens, args.rounds)
        size = step_bytes(model.language_model, decoded["context_tokens"] + args.tokens // 2)
        del model
        summary = decode_summary(decoded["rounds"], decoded["engine_phases"])
        row = {
            "bytes_per_step": size,
            **summary,
            "fraction_of_copy_bandwidth_median": {
                key: value * size["total"] / ceiling for key, value in summary["tok_per_s_median"].items()
            },
            "rounds": decoded["rounds"],
        }
        results[name] = row
        print(name, json.dumps({key: value for key, value in row.items() if key != "rounds"}), flush=True)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa"]
    long_prompt = " ".join(words[i % len(words)] for i in range(args.prompt_words))
    results["prefill"] = prefill(base, long_prompt, max(2, args.repeats // 2))
    print("prefill", results["prefill"], flush=True)
    results["load_average_after"] = os.getloadavg()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2) + "\n")
    print("load average", results["load_average_before"], "->", results["load_average_after"])


if __name__ == "__main__":
    main()
