#!/usr/bin/env bash
# Debian packages the project relies on: OpenBLAS for mlx's CPU backend, and PostgreSQL's server
# binaries for the tests of the PostgreSQL store (tests/_postgres.py starts its own server),
# Chromium and its WebDriver for the /ui page's browser test (tests/e2e/test_ui_browser.py).
# A no-op where they are already installed, on macOS, or without root/apt.
set -euo pipefail
[[ "$(uname -s)" == "Linux" ]] || exit 0
command -v apt-get >/dev/null 2>&1 || exit 0
missing=()
compgen -G "/usr/lib/*/openblas-pthread/libblas.so.3" >/dev/null || missing+=(libopenblas0-pthread)
compgen -G "/usr/lib/postgresql/*/bin/initdb" >/dev/null || missing+=(postgresql)
command -v chromium >/dev/null 2>&1 || missing+=(chromium)
command -v chromedriver >/dev/null 2>&1 || missing+=(chromium-driver)
if [[ ${#missing[@]} -eq 0 ]]; then
  exit 0
fi
if [[ "$(id -u)" != "0" ]]; then
  echo "note: install ${missing[*]} (sudo apt-get install ${missing[*]}): OpenBLAS makes CPU matmul ~15x" \
    "faster; PostgreSQL's binaries run the PostgreSQL store tests, Chromium the /ui browser test" \
    "(they skip without)" >&2
  exit 0
fi
apt-get update -qq
DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${missing[@]}" >/dev/null
