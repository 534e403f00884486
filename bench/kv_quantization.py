"""Quantized KV (`--kv-bits 8|4`, uniform and turboquant) against full precision, on every
fixture family and the 144M benchmark model (docs/performance.md, "Quantized KV").

For each model and precision, one engine (in process, the real generation thread) runs the same
greedy requests (a text prompt and, where the family takes images, an image prompt; 64 tokens):

* KV bytes per token, measured from the prefix-cache entry the request leaves (the arrays the
  batch held), and its ratio to full precision — and to float16, what a GPU run stores (the
  quantized layout's scales follow the activations' dtype, float32 on this CPU);
* greedy agreement with the full-precision run: the index of the first token that differs
  (64 = none in 64), and the share of equal tokens;
* logit error per step while both runs still agree: the largest absolute difference and its
  size relative to the full-precision logits' spread (max - min);
* the prefix cache's capacity in tokens at the same `--prefix-cache-mib`.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        .venv/bin/python bench/kv_quantization.py --out bench/results/kv-quantization.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests._fixture_models import RANDOM_MODEL_PATH  # noqa: E402
from tests.engine._logits_hooks import install, with_hooks  # noqa: E402
from tests.engine._runs import run  # noqa: E402
from tests.engine.test_batching import Recorder, prepared  # noqa: E402
from tests.engine.test_engine_grpc import image_part, png, text_part  # noqa: E402
from training.families import FAMILIES, build_family  # noqa: E402
from vlmserve.engine.config import EngineConfig  # noqa: E402
from vlmserve.engine.loop.generator import Generator  # noqa: E402

TOKENS = 64
PREFIX_CACHE_MIB = 1024


def start(model: Path, bits: int | None, scheme: str = "uniform") -> Generator:
    generator = Generator(
        EngineConfig(
            model=str(model),
            warmup=False,
            kv_bits=bits,
            kv_quant_scheme=scheme,
            prefix_cache_min_tokens=4,
            max_output_tokens=TOKENS,
        )
    )
    generator.start()
    if not generator.ready.wait(300):
        raise RuntimeError(f"{model}: {generator.load_error}")
    return generator


def requests(generator: Generator, with_image: bool) -> dict[str, Any]:
    text = " ".join(f"Shelf {i} holds {i * 7 % 13} boxes;" for i in range(12)) + " How many in all?"
    out = {"text": prepared(generator, text_part(text), temperature=0.0, seed=1, max_tokens=TOKENS)}
    if with_image:
        out["image"] = prepared(
            generator,
            image_part(png((64, 64), seed=3)),
            text_part("Describe it."),
            temperature=0.0,
            seed=2,
            max_tokens=TOKENS,
        )
    return out


def measure(model: Path, bits: int | None, with_image: bool, scheme: str = "uniform") -> dict[str, Any]:
    generator = start(model, bits, scheme)
    try:
        assert generator.loaded is not None
        if bits is not None and not generator.loaded.kv_layout.quantized:
            raise ValueError("kept at full precision (windowed layers, or heads too narrow for groups)")
        out: dict[str, Any] = {}
        for name, request in requests(generator, with_image).items():
            recorder = Recorder()
            request = with_hooks(request, recorder)
            assert generator.prefix_cache is not None
            generator.prefix_cache.clear()
            report = run(generator, {name: request}, f"{bits}-{name}")[name]
            entries = list(generator.prefix_cache._entries.values())
            if not entries:
                raise ValueError("its cache layers are not plain KV layers (no prefix cache, no --kv-bits)")
            (entry,) = entries
            out[name] = {
                "tokens": list(report.token_ids),
                "logits": np.stack(recorder.rows),
                "bytes_per_token": entry.nbytes / entry.token_ids.size,
            }
        return out
    finally:
        generator.stop()


def compare(full: dict[str, Any], quantized: dict[str, Any]) -> dict[str, Any]:
    first = next(
        (i for i, (a, b) in enumerate(zip(full["tokens"], quantized["tokens"], strict=False)) if a != b),
        min(len(full["tokens"]), len(quantized["tokens"])),
    )
    agree = max(first, 1)
    diff = np.abs(full["logits"][:agree] - quantized["logits"][:agree])
    spread = full["logits"][:agree].max(axis=1) - full["logits"][:agree].min(axis=1)
    equal = sum(a == b for a, b in zip(full["tokens"], quantized["tokens"], strict=False))
    return {
        "bytes_per_token": quantized["bytes_per_token"],
        "bytes_vs_full": round(quantized["bytes_per_token"] / full["bytes_per_token"], 4),
        "first_divergence": first,
        "equal_tokens": f"{equal}/{len(full['tokens'])}",
        "max_abs_logit_error": float(diff.max()),
        "max_logit_error_vs_spread": float((diff.max(axis=1) / spread).max()),
        "prefix_cache_tokens": int((PREFIX_CACHE_MIB << 20) // quantized["bytes_per_token"]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter, allow_abbrev=False
    )
    parser.add_argument(
        "--bench-model", type=Path, default=None, help="the 144M model (bench/bench_model.py)"
    )
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    install(pytest.MonkeyPatch())  # rows run their requests' recorders (for this process's life)
    root = Path(tempfile.mkdtemp(prefix="kv-quant-families-"))
    models: dict[str, tuple[Path, bool]] = {
        "qwen2-vl-squares (trained)": (REPO / "models" / "qwen2-vl-squares", True),
        "qwen2-vl-tiny": (RANDOM_MODEL_PATH, True),
    }
    for name, family in sorted(FAMILIES.items()):
        models[name] = (build_family(family, root / name), name != "llava")
    if args.bench_model is not None:
        models["bench-144m"] = (args.bench_model, True)
    report: dict[str, Any] = {"load": os.getloadavg(), "tokens": TOKENS, "models": {}}
    for name, (path, with_image) in models.items():
        try:
            full = measure(path, None, with_image)
        except ValueError as error:
            report["models"][name] = f"not run: {error}"
            print(name, report["models"][name], flush=True)
            continue
        entry: dict[str, Any] = {"full_bytes_per_token": full["text"]["bytes_per_token"]}
        for bits, scheme in ((8, "uniform"), (4, "uniform"), (8, "turboquant"), (4, "turboquant")):
            label = f"{bits}-bit" if scheme == "uniform" else f"{bits}-bit {scheme}"
            try:
                quantized = measure(path, bits, with_image, scheme)
            except Exception as error:  # a family whose cache mlx-vlm cannot quantize
                entry[label] = f"not run: {error}"
                continue
            entry[label] = {kind: compare(full[kind], quantized[kind]) for kind in full}
        report["models"][name] = entry
        print(name, json.dumps(entry, default=str), flush=True)
    text = json.dumps(report, indent=1, default=str)
    if args.out is not None:
        args.out.write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
