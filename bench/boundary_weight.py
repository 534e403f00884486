"""What a prefix-cache entry of a real checkpoint weighs, computed from its published text config
(docs/performance.md, the boundary paragraph; issue 33 item 6). No model is loaded.

An entry of a model with layers no prefix can be cut from keeps those layers' state at each of
its boundaries (kv/snapshots.py), and its plain attention layers' KV per token as any entry:

- a Gated DeltaNet layer (Qwen3.5/3.6, mlx-vlm's `ArraysCache`): its conv window, (kernel - 1) x
  (2 x key heads x key dim + value heads x value dim) channels, and its state, value heads x value
  dim x key dim: fixed, however long the prompt;
- a sliding-window layer (Gemma 3/4, mlx-vlm's `RotatingKVCache`): its window, `sliding_window`
  positions x KV heads x head dim, keys and values;
- a full-attention layer: KV heads x head dim, keys and values, a token (mlx-vlm keeps values
  beside keys even where Gemma 4's `attention_k_eq_v` computes both from one projection).

    .venv/bin/python bench/boundary_weight.py
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import Any

MIB = 1 << 20

# The fields these sizes read, from each checkpoint's published config.json (`text_config`).
CONFIGS: dict[str, dict[str, Any]] = {
    "Qwen3.6-35B-A3B": {
        "num_hidden_layers": 40,
        "full_attention_interval": 4,
        "num_key_value_heads": 2,
        "head_dim": 256,
        "linear_conv_kernel_dim": 4,
        "linear_num_key_heads": 16,
        "linear_key_head_dim": 128,
        "linear_num_value_heads": 32,
        "linear_value_head_dim": 128,
    },
    "Gemma 3 27B": {
        "num_hidden_layers": 62,
        "sliding_window_pattern": 6,
        "sliding_window": 1024,
        "num_key_value_heads": 16,
        "head_dim": 128,
    },
    "Gemma 4 26B-A4B": {
        "num_hidden_layers": 30,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 5,
        "sliding_window": 1024,
        "num_key_value_heads": 8,
        "head_dim": 256,
        "num_global_key_value_heads": 2,
        "global_head_dim": 512,
    },
    "Gemma 4 31B": {
        "num_hidden_layers": 60,
        "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10,
        "sliding_window": 1024,
        "num_key_value_heads": 16,
        "head_dim": 256,
        "num_global_key_value_heads": 4,
        "global_head_dim": 512,
    },
}


@dataclass(frozen=True)
class Weight:
    boundary_bytes: int  # every non-plain layer's state, once per boundary
    bytes_per_token: int  # the plain layers' KV
    boundary_layers: int
    plain_layers: int


def _layer_kinds(config: dict[str, Any]) -> list[str]:
    """ "linear", "sliding" or "full" for each layer, as the config declares them."""
    layers = int(config["num_hidden_layers"])
    if "layer_types" in config:
        kinds = {"sliding_attention": "sliding", "full_attention": "full", "linear_attention": "linear"}
        return [kinds[kind] for kind in config["layer_types"][:layers]]
    if "full_attention_interval" in config:  # Qwen3.5/3.6: every interval-th layer is full
        interval = int(config["full_attention_interval"])
        return ["full" if (index + 1) % interval == 0 else "linear" for index in range(layers)]
    pattern = int(config["sliding_window_pattern"])  # Gemma 3: every pattern-th layer is global
    return ["full" if (index + 1) % pattern == 0 else "sliding" for index in range(layers)]


def weight(config: dict[str, Any], *, kv_bytes: int = 2, state_bytes: int = 4) -> Weight:
    """An entry's weight: `kv_bytes` per KV element (bfloat16: 2), `state_bytes` per recurrent
    state element (mlx-vlm keeps Gated DeltaNet states in float32)."""
    kinds = _layer_kinds(config)
    kv_heads, head_dim = int(config["num_key_value_heads"]), int(config["head_dim"])
    full_heads = int(config.get("num_global_key_value_heads") or kv_heads)
    full_dim = int(config.get("global_head_dim") or head_dim)
    boundary = 0
    for kind in kinds:
        if kind == "sliding":
            boundary += int(config["sliding_window"]) * kv_heads * head_dim * 2 * kv_bytes
        elif kind == "linear":
            key_heads = int(config["linear_num_key_heads"])
            key_dim = int(config["linear_key_head_dim"])
            value_heads = int(config["linear_num_value_heads"])
            value_dim = int(config["linear_value_head_dim"])
            channels = 2 * key_heads * key_dim + value_heads * value_dim
            conv = (int(config["linear_conv_kernel_dim"]) - 1) * channels
            boundary += (conv + value_heads * value_dim * key_dim) * state_bytes
    full = kinds.count("full")
    return Weight(boundary, full * full_heads * full_dim * 2 * kv_bytes, len(kinds) - full, full)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    parser.add_argument("--tokens", type=int, default=20_000, help="an entry's tokens (default 20,000)")
    args = parser.parse_args()
    entry_column = f"entry of {args.tokens:,} tokens, one boundary (MiB)"
    print(f"| checkpoint | boundary (MiB) | plain KV a token (KiB) | {entry_column} |")
    print("|---|---|---|---|")
    for name, config in CONFIGS.items():
        found = weight(config)
        entry = found.bytes_per_token * args.tokens + found.boundary_bytes
        print(
            f"| {name} | {found.boundary_bytes / MIB:,.1f} ({found.boundary_layers} layers) "
            f"| {found.bytes_per_token / 1024:,.1f} ({found.plain_layers} layers) | {entry / MIB:,.0f} |"
        )


if __name__ == "__main__":
    main()
