"""On an accelerator (issue 37 item 5): B=1 decode against the card's bandwidth ceiling and 8
concurrent requests against mlx-vlm's server, on random-weight 4-bit checkpoints at real sizes.

Run through bench/accelerator.sh (it unpacks the carried mlx[cuda] and the project's other needs
on the device machine; docs/performance.md, "On an accelerator", has the one-line command):

    bench/accelerator.sh pack            # here: .accel/site.tar.xz, the packages the card lacks
    bench/accelerator.sh run [ARGS]      # there: python -m bench.accelerator ARGS
    python -m bench.accelerator --smoke  # here, on this CPU: the same path, tiny shapes, < ~2 min

For each shape (SHAPES: Qwen2.5-VL-7B and Qwen3.6-35B-A3B, `qwen3_5_moe`), in one run:
1. The checkpoint: the family fixture's files (training/families: its tokenizer, template,
   processor) with the published sizes laid over its config (bench/boundary_weight.py's figures
   where it has them), mlx-vlm's own Model with random weights, cast to bfloat16 and quantized to
   4 bits (group 64) the way `mlx_vlm.convert` does, saved a shard at a time (the parameters
   stay lazy until then: a 35B model never sits whole in float). Shapes decide the speed, not
   the values; the output head's rows for special tokens and for ids past the small tokenizer
   are zero, so greedy decoding never stops early and every token detokenises.
2. The ceiling: a streaming copy in mlx on the device (`x * 1`, 1 GiB, read + written, STREAM's
   "copy"), best of 5 loops of 10 copies.
3. B=1 decode, in-process (bench/bandwidth.py's `forward_alone`, plain and pipelined) as
   tok/s x bytes read a step / the ceiling. The bytes: bench/bandwidth.py's `step_bytes`, with
   the experts a token does not route to left out (8 of 256) and, for the hybrid model, the
   KV of its full-attention layers only plus its Gated DeltaNet states
   (bench/boundary_weight.py's `weight`).
4. Served: our engine + facade against mlx-vlm's server (bench/peers.py's targets), both up at
   once, speculation off, the same streamed chat requests with a nonce each: 3 single-stream
   requests, then 8 concurrent, `--rounds` rounds alternating which server goes first; the
   best round each and the ratio ours / mlx-vlm's.
The JSON goes to $OUT/accelerator.json (the device tool's folder; `--out` elsewhere), rewritten
after each shape so a cut-off run keeps what it measured; a short table is printed at the end.

Device time (sized for ~8 of a session's 15 minutes, with a machine start of 1-2): unpacking
~20 s; per shape building ~30 s (7B, 5.6 GB) and ~90 s (35B, 20.4 GB written), B=1 ~20 s, both
servers loading ~40 s, the workloads ~40 s (2 rounds x 2 servers x (3 + 8) x 128 tokens). Run it
with timeout_s 480; where the 35B does not fit the time left, `--shapes qwen2_5_vl_7b` alone.
"""

from __future__ import annotations

import argparse
import asyncio
import copy
import gc
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: reach training/ and tests/ without installing them

from bench.bandwidth import forward_alone, step_bytes  # noqa: E402
from bench.boundary_weight import CONFIGS as BOUNDARY_CONFIGS  # noqa: E402
from bench.boundary_weight import weight as boundary_weight  # noqa: E402

GIB = 1 << 30
QUANT_BITS, QUANT_GROUP = 4, 64
# The exit status when the card or the carried packages are not there (bench/accelerator.sh too).
NO_ACCELERATOR = 3


@dataclass(frozen=True)
class Shape:
    """A published checkpoint's sizes, laid over a family fixture's config."""

    family: str  # training/families FAMILIES key
    stands_for: str
    text: dict[str, Any]  # the text model's fields (top level, or text_config where nested)
    vision: dict[str, Any] = field(default_factory=dict)


# From each checkpoint's published config.json: the fields that decide the shapes. Qwen3.6's
# attention and Gated DeltaNet figures are bench/boundary_weight.py's (one copy of them).
SHAPES: dict[str, Shape] = {
    "qwen2_5_vl_7b": Shape(
        "qwen2_5_vl",
        "Qwen/Qwen2.5-VL-7B-Instruct",
        text={
            "vocab_size": 152064,
            "hidden_size": 3584,
            "intermediate_size": 18944,
            "num_hidden_layers": 28,
            "num_attention_heads": 28,
            "num_key_value_heads": 4,
            "max_position_embeddings": 128000,
            "max_window_layers": 28,
            "sliding_window": 32768,
            "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]},
            "tie_word_embeddings": False,
        },
        vision={
            "depth": 32,
            "hidden_size": 1280,
            "intermediate_size": 3420,
            "num_heads": 16,
            "window_size": 112,
            "fullatt_block_indexes": [7, 15, 23, 31],
        },
    ),
    "qwen3_6_35b_a3b": Shape(
        "qwen3_5_moe",
        "Qwen/Qwen3.6-35B-A3B",
        text={
            **BOUNDARY_CONFIGS["Qwen3.6-35B-A3B"],
            "vocab_size": 248320,
            "hidden_size": 2048,
            "num_attention_heads": 16,
            "max_position_embeddings": 262144,
            "num_experts": 256,
            "num_experts_per_tok": 8,
            "moe_intermediate_size": 512,
            "shared_expert_intermediate_size": 512,
            "tie_word_embeddings": False,
            "rope_parameters": {
                "rope_type": "default",
                "mrope_section": [11, 11, 10],
                "mrope_interleaved": True,
                "rope_theta": 10_000_000.0,
                "partial_rotary_factor": 0.25,
            },
        },
        vision={
            "depth": 27,
            "hidden_size": 1152,
            "intermediate_size": 4304,
            "num_heads": 16,
            "num_position_embeddings": 2304,
        },
    ),
}


# --- pure parts: the config, the bytes a step reads ----------------------------------------------


def text_fields(config: dict[str, Any]) -> dict[str, Any]:
    """The text model's fields: `text_config` where the family nests them, else the top level."""
    nested = config.get("text_config")
    return nested if isinstance(nested, dict) and nested else config


def published_config(fixture: dict[str, Any], shape: Shape) -> dict[str, Any]:
    """The fixture's config with `shape`'s sizes laid over it (a new dict); the vision tower's
    output width follows the text model's."""
    config = copy.deepcopy(fixture)
    text = text_fields(config)
    text.update(copy.deepcopy(shape.text))
    config["vision_config"].update(copy.deepcopy(shape.vision))
    config["vision_config"]["out_hidden_size"] = text["hidden_size"]
    return config


def is_expert(name: str) -> bool:
    """A routed expert's parameter (mlx-vlm's SwitchGLU), not the shared expert or the router."""
    return ".switch_mlp." in name


def active_bytes(
    weights: int, expert_weights: int, text: dict[str, Any], context: int, kv: int
) -> dict[str, int]:
    """Bytes one B=1 decode step reads: `weights` as bench/bandwidth.py's `step_bytes` counts them
    (the embedding's one row) less the routed experts a token does not use (`expert_weights` of
    them all), and the cache: a hybrid model's (every `full_attention_interval`-th layer full)
    full-attention KV at `context` plus its Gated DeltaNet states (bench/boundary_weight.py;
    bfloat16 KV, float32 states), else `kv` (step_bytes' own, every layer full attention)."""
    experts = int(text.get("num_experts") or 0)
    if experts:
        used = int(text["num_experts_per_tok"])
        weights -= expert_weights - expert_weights * used // experts
    if "full_attention_interval" in text:
        cache = boundary_weight(text)
        kv = cache.bytes_per_token * context + cache.boundary_bytes
    return {"weights": weights, "kv": kv, "total": weights + kv}


def fraction(tok_per_s: float, bytes_per_step: int, ceiling_gbps: float) -> float:
    """tok/s x bytes a step / the copy bandwidth: how much of the ceiling a decode uses."""
    return tok_per_s * bytes_per_step / (ceiling_gbps * 1e9)


# --- the device ----------------------------------------------------------------------------------


def accelerator() -> str | None:
    """The card's name when mlx sees a GPU through CUDA; None otherwise."""
    import mlx.core as mx

    if not mx.cuda.is_available():
        return None
    info: dict[str, Any] = mx.device_info() if hasattr(mx, "device_info") else {}
    return str(info.get("device_name") or info.get("architecture") or "cuda")


# What the servers import at start: a missing one fails here in seconds, not after the build.
SERVED_MODULES = ("vlmserve.engine.cli", "vlmserve.facade.cli", "mlx_vlm.server", "llguidance.hf")


def probe() -> None:
    """Raise unless the servers' modules import and the card runs what the benchmark needs: a
    JIT-compiled elementwise kernel, a matmul (cuBLAS) and a 4-bit quantized matmul (mlx's own
    kernels: the carried libmlx.so keeps the sm_90 images alone, bench/accelerator_pack.py)."""
    import importlib

    import mlx.core as mx

    for module in SERVED_MODULES:
        importlib.import_module(module)
    x = mx.random.normal((64, 256)).astype(mx.bfloat16)
    w = mx.random.normal((128, 256)).astype(mx.bfloat16)
    packed, scales, biases = mx.quantize(w, group_size=QUANT_GROUP, bits=QUANT_BITS)
    checks = {
        "elementwise": mx.exp(x) * 2,
        "matmul": x @ w.T,
        "quantized matmul": mx.quantized_matmul(x, packed, scales, biases, group_size=QUANT_GROUP),
    }
    for name, value in checks.items():
        try:
            mx.eval(value)
        except Exception as error:
            raise RuntimeError(f"{name} failed on the card: {error}") from error


def copy_bandwidth(size: int, repeats: int = 5, copies: int = 10) -> float:
    """GB/s of a streaming copy in mlx (`x * 1`, `size` bytes read + written), best of
    `repeats` loops of `copies` (one eval a loop: no per-copy launch wait)."""
    import mlx.core as mx

    source = mx.ones((size // 4,), dtype=mx.float32)
    mx.eval(source)
    mx.eval(source * 1)
    best = 0.0
    for _ in range(repeats):
        started = time.perf_counter()
        mx.eval([source * 1 for _ in range(copies)])
        best = max(best, 2 * size * copies / (time.perf_counter() - started) / 1e9)
    del source
    mx.clear_cache()
    return best


# --- the checkpoint ------------------------------------------------------------------------------


def head_rows_kept(vocab: int, tokenizer_size: int, specials: Sequence[int]) -> list[bool]:
    """Which of the output head's `vocab` rows keep their random values: not the special tokens'
    (a random model would stop on an end-of-turn id at once) nor the ids past the tokenizer's
    (they detokenise to nothing). The rest stay random: greedy decoding runs to max_tokens."""
    kept = [index < tokenizer_size for index in range(vocab)]
    for index in specials:
        if 0 <= index < vocab:
            kept[index] = False
    return kept


def build_checkpoint(name: str, out_dir: Path, *, smoke: bool, seed: int = 0) -> Path:
    """`out_dir`: the family fixture's files, the shape's sizes (the fixture's own in `--smoke`),
    random bfloat16 weights quantized to 4 bits as mlx_vlm.convert does; reuses a finished one.
    `--smoke` keeps float32: mlx's CPU expert kernels (GatherMM) take nothing else."""
    import mlx.core as mx
    from mlx.utils import tree_flatten, tree_map_with_path
    from mlx_vlm.quant_utils import quantize_model
    from mlx_vlm.utils import save_config, save_weights, skip_multimodal_module
    from tokenizers import Tokenizer

    from training.families import FAMILIES
    from training.families.build import random_model, write_family_files

    done = out_dir / "accelerator-build.json"
    if done.is_file():
        return out_dir
    shape = SHAPES[name]
    fixture = write_family_files(FAMILIES[shape.family], out_dir)
    config = fixture if smoke else published_config(fixture, shape)
    model = random_model(config, seed)

    dtype = mx.float32 if smoke else mx.bfloat16

    def cast(_: str, value: Any) -> Any:
        return value.astype(dtype) if mx.issubdtype(value.dtype, mx.floating) else value

    model.update(tree_map_with_path(cast, model.parameters()))
    language_model = model.language_model
    head = language_model.lm_head if hasattr(language_model, "lm_head") else language_model.model.embed_tokens
    tokenizer = Tokenizer.from_file(str(out_dir / "tokenizer.json"))
    kept = head_rows_kept(
        int(text_fields(config)["vocab_size"]),
        tokenizer.get_vocab_size(),
        list(tokenizer.get_added_tokens_decoder()),
    )
    head.weight = head.weight * mx.array(kept, dtype=dtype)[:, None]
    model_predicate = getattr(model, "quant_predicate", None)

    def predicate(path: str, module: Any) -> Any:
        if skip_multimodal_module(path):
            return False
        return model_predicate(path, module) if model_predicate is not None else True

    model, config = quantize_model(model, config, QUANT_GROUP, QUANT_BITS, quant_predicate=predicate)
    # One array at a time: its random float32 source lives only while it is quantized, so the
    # peak is the 4-bit model (20 GB for the 35B) plus one expert stack (1 GiB), never the
    # float model (140 GB), on a card whose memory mlx may take as managed memory.
    parameters: list[tuple[str, Any]] = tree_flatten(model.parameters())  # type: ignore[assignment]
    for _, value in parameters:
        mx.eval(value)
    del parameters
    save_weights(out_dir, model, donate_weights=True)
    save_config(config, config_path=out_dir / "config.json")
    del model
    gc.collect()
    mx.clear_cache()
    size = sum(path.stat().st_size for path in out_dir.glob("*.safetensors"))
    done.write_text(json.dumps({"shape": name, "smoke": smoke, "bytes": size}))
    return out_dir


# --- the measurements ----------------------------------------------------------------------------


def decode_b1(model_dir: Path, *, prompt: int, tokens: int, ceiling_gbps: float) -> dict[str, Any]:
    """B=1 greedy decode of the language model alone, plain and pipelined, after a `prompt`-token
    prefill: tok/s and the fraction of the copy ceiling, with the bytes a step reads."""
    import mlx.core as mx
    from mlx.utils import tree_flatten
    from mlx_vlm.utils import load

    model, _ = load(str(model_dir))
    language_model = model.language_model
    forward_alone(model, prompt, 8, pipelined=True)  # warm: kernels compiled, buffers sized
    plain, _ = forward_alone(model, prompt, tokens, pipelined=False)
    pipelined, cpu_ms = forward_alone(model, prompt, tokens, pipelined=True)
    context = prompt + tokens // 2
    counted = step_bytes(language_model, context)
    parameters: list[tuple[str, Any]] = tree_flatten(language_model.parameters())  # type: ignore[assignment]
    experts = sum(value.nbytes for name, value in parameters if is_expert(name))
    text = text_fields(json.loads((model_dir / "config.json").read_text()))
    size = active_bytes(counted["weights"], experts, text, context, counted["kv"])
    del model, language_model, parameters
    gc.collect()
    mx.clear_cache()
    return {
        "context_tokens": context,
        "bytes_per_step": size,
        "tok_per_s": {"forward": plain, "forward_pipelined": pipelined},
        "fraction_of_ceiling": {
            "forward": fraction(plain, size["total"], ceiling_gbps),
            "forward_pipelined": fraction(pipelined, size["total"], ceiling_gbps),
        },
        "driving_thread_cpu_ms_per_token": cpu_ms,
    }


def served(model_dir: Path, *, peers_root: Path, tokens: int, rounds: int) -> dict[str, Any]:
    """Our engine + facade and mlx-vlm's server, both up, alternating: single and c8 (peers)."""
    from bench import peers

    logs = Path(tempfile.mkdtemp(prefix="vlmserve-accelerator-"))
    servers: list[Any] = []
    started: dict[str, str] = {}
    try:
        servers.append(peers.start_vlmserve(model_dir, logs))
        started["vlmserve"] = "ok"
        try:
            servers.append(peers.start_peer("mlx-vlm", model_dir, logs, peers_root))
            started["mlx-vlm"] = "ok"
        except Exception as error:  # a result: reported, ours still measured
            started["mlx-vlm"] = f"{type(error).__name__}: {str(error)[-600:]}"
        options = argparse.Namespace(
            rounds=rounds, workloads=["single", "c8"], single=3, tokens=tokens, agent_tokens=16
        )
        figures = asyncio.run(peers.measure(servers, options))
    finally:
        for server in servers:
            server.stop()
    return {
        "started": started,
        "summary": peers.summary(figures),
        "rounds": figures.rounds,
        "errors": figures.errors,
        "counted_by_usage": figures.counted_by_usage,
        "logs": str(logs),
    }


def table(results: dict[str, Any]) -> str:
    """The short table: per shape, B=1 as tok/s and fraction of the ceiling, served figures."""
    lines = [
        f"card: {results['device']}  copy ceiling: {results['copy_GBps']:.0f} GB/s",
        "| shape | GB/step | B=1 tok/s (pipelined) | of ceiling | single tok/s ours / mlx-vlm "
        "| c8 tok/s ours / mlx-vlm | c8 ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for name, row in results["shapes"].items():
        decode = row.get("decode", {})
        summary = row.get("served", {}).get("summary", {})

        def pair(workload: str, summary: dict[str, Any] = summary) -> str:
            cells = summary.get(workload, {})
            ours = cells.get("vlmserve", {}).get("best")
            theirs = cells.get("mlx-vlm", {}).get("best")
            return f"{ours if ours is not None else '-'} / {theirs if theirs is not None else '-'}"

        ratio = summary.get("c8", {}).get("mlx-vlm", {}).get("vlmserve_ratio", "-")
        step = decode.get("bytes_per_step", {}).get("total", 0) / 1e9
        lines.append(
            f"| {name} | {step:.2f} | {decode.get('tok_per_s', {}).get('forward_pipelined', 0):.1f} "
            f"| {decode.get('fraction_of_ceiling', {}).get('forward_pipelined', 0):.0%} "
            f"| {pair('single')} | {pair('c8')} | {ratio} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0], allow_abbrev=False)
    parser.add_argument("--smoke", action="store_true", help="this CPU: the fixtures' tiny shapes")
    parser.add_argument("--shapes", nargs="+", choices=list(SHAPES), default=list(SHAPES))
    parser.add_argument("--tokens", type=int, default=None, help="decode tokens (128; smoke 16)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--work-dir", type=Path, default=Path(tempfile.gettempdir()) / "vlmserve-accelerator")
    parser.add_argument("--peers-root", type=Path, default=Path("/work/peers"))
    parser.add_argument("--out", type=Path, default=None, help="default $OUT/accelerator.json")
    args = parser.parse_args(argv)
    out = args.out or Path(os.environ.get("OUT") or "bench/results") / (
        "accelerator-smoke.json" if args.smoke else "accelerator.json"
    )
    try:
        device = accelerator()
        probe()
    except Exception as error:  # mlx missing or broken: the carried packages did not load or run
        print(f"accelerator: mlx did not run ({type(error).__name__}: {error})", file=sys.stderr)
        return NO_ACCELERATOR
    if device is None and not args.smoke:
        print(
            "accelerator: mlx sees no CUDA GPU (mlx[cuda] not installed, or no card): nothing "
            "measured. On this CPU use --smoke.",
            file=sys.stderr,
        )
        return NO_ACCELERATOR
    tokens = args.tokens or (16 if args.smoke else 128)
    results: dict[str, Any] = {
        "device": device or "cpu",
        "smoke": args.smoke,
        "quantization": {"bits": QUANT_BITS, "group_size": QUANT_GROUP},
        "copy_GBps": copy_bandwidth(256 << 20, copies=2) if args.smoke else copy_bandwidth(GIB),
        "shapes": {},
    }
    print(f"copy ceiling {results['copy_GBps']:.1f} GB/s on {results['device']}", flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    for name in args.shapes:
        row: dict[str, Any] = {"stands_for": SHAPES[name].stands_for}
        results["shapes"][name] = row
        started = time.perf_counter()
        model_dir = build_checkpoint(
            name, args.work_dir / (f"{name}-smoke" if args.smoke else name), smoke=args.smoke
        )
        row["checkpoint"] = json.loads((model_dir / "accelerator-build.json").read_text())
        row["build_s"] = time.perf_counter() - started
        print(
            f"{name}: built in {row['build_s']:.0f} s ({row['checkpoint']['bytes'] / 1e9:.2f} GB)", flush=True
        )
        row["decode"] = decode_b1(model_dir, prompt=32, tokens=tokens, ceiling_gbps=results["copy_GBps"])
        print(f"{name}: decode {json.dumps(row['decode'])}", flush=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
        row["served"] = served(model_dir, peers_root=args.peers_root, tokens=tokens, rounds=args.rounds)
        print(f"{name}: served {json.dumps(row['served']['summary'])}", flush=True)
        out.write_text(json.dumps(results, indent=2) + "\n")
    print(table(results))
    print(f"written: {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
