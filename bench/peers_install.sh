#!/bin/bash
# The peers of bench/peers.py, each in a venv of its own under $1 (default /work/peers): never a
# dependency of this project. Each gets mlx[cpu] 0.32.4 added (the recipe for Linux CPU).
# A failed install is logged and skipped; bench/peers.py reports that peer as not started.
set -u
ROOT=${1:-/work/peers}
mkdir -p "$ROOT" && cd "$ROOT" || exit 1
install_peer() {
  local name=$1; shift
  python3.11 -m venv "$name" && "$name/bin/pip" install -q --upgrade pip &&
    "$name/bin/pip" install -q "$@" "mlx[cpu]==0.32.4" > "$name.log" 2>&1
  echo "$name rc=$?"
}
install_peer mlx-vlm mlx-vlm==0.7.10
install_peer vllm-mlx vllm-mlx==0.6.0
install_peer rapid-mlx rapid-mlx==0.16.10
install_peer fusion-mlx "fusion-mlx[vlm]==0.10.24"
# Resolves only to 1.7.1 on Linux ("what a Linux user gets").
install_peer mlx-openai-server mlx-openai-server
