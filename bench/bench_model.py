"""The benchmark model: a random qwen2_vl of ~144M parameters in float32, built on demand.

Memory-bound like a real model on this CPU (unlike the 1.9M-parameter test fixture), with the
project's tiny tokenizer and processor. Never committed: `python bench/bench_model.py --out DIR`
builds it (a few seconds); bench/batching.py builds it when its directory is missing.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))  # a script: reach training/ and tests/ without installing them

from tests._fixture_models import RANDOM_MODEL_PATH  # noqa: E402
from training.make_fixture_model import (  # noqa: E402
    FixtureArchitecture,
    copy_tokenizer_from,
    write_model_files,
    write_random_weights,
)

DEFAULT_DIR = Path("/tmp/vlmserve-bench-qwen2-vl-144m")

# 12 layers of hidden 1024 (16 heads of 64, 4 KV heads), MLP 2816: ~144M parameters.
ARCHITECTURE = FixtureArchitecture(
    hidden_size=1024,
    num_hidden_layers=12,
    num_attention_heads=16,
    num_key_value_heads=4,
    intermediate_size=2816,
    # M-RoPE sections cover half a head (64 / 2 = 32).
    mrope_section=(8, 12, 12),
    torch_dtype="float32",
)


def build_bench_model(out_dir: Path = DEFAULT_DIR, *, seed: int = 0) -> tuple[Path, int]:
    """(model dir, parameters); reuses a complete earlier build."""
    done = out_dir / "bench-model.json"
    if done.is_file():
        return out_dir, int(json.loads(done.read_text())["parameters"])
    tokenizer = copy_tokenizer_from(RANDOM_MODEL_PATH)
    config = write_model_files(out_dir, tokenizer, ARCHITECTURE)
    parameters = write_random_weights(out_dir, config, seed=seed, dtype="float32")
    done.write_text(json.dumps({"parameters": parameters, "seed": seed}))
    return out_dir, parameters


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0] if __doc__ else None, allow_abbrev=False
    )
    parser.add_argument("--out", type=Path, default=DEFAULT_DIR)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    path, parameters = build_bench_model(args.out, seed=args.seed)
    print(f"{path}: {parameters / 1e6:.1f}M parameters, float32")


if __name__ == "__main__":
    main()
