"""Where a B=1 float32 decode step's time goes on the CPU backend (issue 37.2): its matmuls against
the rate this machine streams weights at.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \\
        python -m bench.matmul_read [--rounds 5] [--out bench/results/matmul_read.json]

A decode step of one row multiplies a 1×K vector by every weight matrix once: it reads the
weights and little else. On the 144M bench model (bench/bench_model.py: 12 layers of hidden 1024,
MLP 2816) the step's matrices are built at their shapes, all twelve layers' worth (415 MB of MLP
weights plus the attention projections: far more than any cache), and read four ways, in turn,
`--rounds` times (best of 3 in each round; medians over rounds):

- `numpy_dot`: a streaming read (`np.dot` of a 256 MiB float32 vector with itself) — the read
  ceiling, as bench/bandwidth.py's copy is the copy ceiling;
- `numpy_gemv`: `W @ x` with numpy's own BLAS (a matrix-vector product: each weight read once);
- `mlx_linear`: `x @ W.T` with `x` of shape (1, K) — what `mlx.nn.Linear` computes, through the
  BLAS MLX's CPU backend calls (a general matrix product with M = 1);
- `mlx_pretransposed`: `x @ Wt` with `Wt` stored transposed — the same product without the
  transposed operand.

Each as GB/s of weights read; and the model's own forward is in bench/bandwidth.py. The figures
say how much of a decode step's gap to the bandwidth ceiling is the matrix product's kernel
(a backend property, the same for every server running mlx-vlm's model on this machine) rather
than anything between steps.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.bench_model import ARCHITECTURE

READ_BYTES = 256 << 20


def layer_shapes() -> list[tuple[int, int]]:
    """(out, in) of every matrix one decode step multiplies by, all layers (the head aside)."""
    hidden = ARCHITECTURE.hidden_size
    head_dim = hidden // ARCHITECTURE.num_attention_heads
    kv = ARCHITECTURE.num_key_value_heads * head_dim
    mlp = ARCHITECTURE.intermediate_size
    per_layer = [(hidden, hidden), (kv, hidden), (kv, hidden), (hidden, hidden)]
    per_layer += [(mlp, hidden), (mlp, hidden), (hidden, mlp)]
    return per_layer * ARCHITECTURE.num_hidden_layers


def best_seconds(run: Callable[[], object], repeats: int = 3) -> float:
    run()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - started)
    return best


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0], allow_abbrev=False)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--out", type=Path, default=Path("bench/results/matmul_read.json"))
    args = parser.parse_args(argv)
    import mlx.core as mx
    import numpy as np

    shapes = layer_shapes()
    weights = [mx.random.normal(shape) for shape in shapes]
    transposed = [mx.contiguous(weight.T) for weight in weights]
    mx.eval(weights, transposed)
    host = [np.array(weight) for weight in weights]
    row = mx.random.normal((1, ARCHITECTURE.hidden_size))
    wide_row = mx.random.normal((1, ARCHITECTURE.intermediate_size))
    mx.eval(row, wide_row)
    vectors = {vector.shape[1]: np.array(vector)[0] for vector in (row, wide_row)}
    stream = np.ones(READ_BYTES // 4, dtype=np.float32)
    weight_bytes = sum(weight.nbytes for weight in weights)

    def rows(width: int) -> Any:
        return row if width == row.shape[1] else wide_row

    ways: dict[str, tuple[Callable[[], object], int]] = {
        "numpy_dot": (lambda: np.dot(stream, stream), READ_BYTES),
        "numpy_gemv": (lambda: [matrix @ vectors[matrix.shape[1]] for matrix in host], weight_bytes),
        "mlx_linear": (lambda: mx.eval([rows(w.shape[1]) @ w.T for w in weights]), weight_bytes),
        "mlx_pretransposed": (lambda: mx.eval([rows(w.shape[0]) @ w for w in transposed]), weight_bytes),
    }
    rounds: dict[str, list[float]] = {name: [] for name in ways}
    load_before = os.getloadavg()
    for index in range(args.rounds):
        order = list(ways) if index % 2 == 0 else list(reversed(ways))
        for name in order:
            run, size = ways[name]
            rounds[name].append(size / best_seconds(run) / 1e9)
    medians = {name: statistics.median(values) for name, values in rounds.items()}
    results = {
        "load_average": [load_before, os.getloadavg()],
        "weight_bytes": weight_bytes,
        "GBps_median": medians,
        "mlx_linear_over_numpy_gemv": medians["mlx_linear"] / medians["numpy_gemv"],
        "mlx_linear_over_read": medians["mlx_linear"] / medians["numpy_dot"],
        "pretransposed_over_linear": medians["mlx_pretransposed"] / medians["mlx_linear"],
        "numpy_blas": np.show_config(mode="dicts")["Build Dependencies"]["blas"],
        "rounds_GBps": rounds,
    }
    print(json.dumps({key: value for key, value in results.items() if key != "rounds_GBps"}, indent=1))
    args.out.write_text(json.dumps(results, indent=1) + "\n")


if __name__ == "__main__":
    main()
