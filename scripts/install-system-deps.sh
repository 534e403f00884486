#!/usr/bin/env bash
# Debian packages the engine relies on: OpenBLAS for mlx's CPU backend.
# A no-op where it is already installed, on macOS, or without root/apt.
set -euo pipefail
[[ "$(uname -s)" == "Linux" ]] || exit 0
command -v apt-get >/dev/null 2>&1 || exit 0
if compgen -G "/usr/lib/*/openblas-pthread/libblas.so.3" >/dev/null; then
  exit 0
fi
if [[ "$(id -u)" != "0" ]]; then
  echo "note: install libopenblas0-pthread (sudo apt-get install libopenblas0-pthread) for ~15x faster CPU matmul" >&2
  exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq libopenblas0-pthread >/dev/null
