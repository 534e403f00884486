#!/bin/bash
# On an accelerator (issue 37 item 5): bench/accelerator.py on the device machine, which has no
# package registry. Two verbs:
#   bench/accelerator.sh pack          here: .accel/site.tar.xz (bench/accelerator_pack.py)
#   bench/accelerator.sh run [ARGS]    there: unpack it beside the image's PyTorch CUDA libraries,
#                                      then python -m bench.accelerator ARGS (JSON under $OUT)
# Exits 3 at once, saying why, when the bundle is not carried or mlx sees no CUDA GPU.
set -u
cd "$(dirname "$0")/.." || exit 1
verb=${1:-}
shift || true
case "$verb" in
  pack)
    exec "${PYTHON:-.venv/bin/python}" -m bench.accelerator_pack "$@" ;;
  run) ;;
  *)
    echo "usage: bench/accelerator.sh pack | run [bench/accelerator.py arguments]" >&2
    exit 2 ;;
esac

BUNDLE=${ACCEL_BUNDLE:-.accel/site.tar.xz}  # ACCEL_BUNDLE: a rehearsal on this CPU (pack --backend cpu)
if [ ! -f "$BUNDLE" ]; then
  echo "accelerator: $BUNDLE is missing: run 'bench/accelerator.sh pack' first and name .accel" \
    "in the device tool's carry (mlx[cuda] cannot be installed there: no registry)" >&2
  exit 3
fi
command -v nvidia-smi >/dev/null &&
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
PY=${PYTHON:-python3}  # the image's python3: the one with PyTorch and its CUDA libraries
ROOT=${ACCEL_ROOT:-/tmp/vlmserve-accel}
SITE=$ROOT/site VENV=$ROOT/venv
rm -rf "$ROOT" && mkdir -p "$SITE" "$ROOT/peers" || exit 1
"$PY" -c 'import sys, tarfile; tarfile.open(sys.argv[1]).extractall(sys.argv[2], filter="data")' \
  "$BUNDLE" "$SITE" || exit 3
BASE_SITE=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
# libmlx.so finds cuBLAS, cuDNN, NCCL, NVRTC through $ORIGIN/../../nvidia/...: PyTorch's.
[ -d "$BASE_SITE/nvidia" ] && ln -s "$BASE_SITE/nvidia" "$SITE/nvidia"
# A venv of its own (bench/peers.py and tests/_services.py start vlmserve-engine, vlmserve-facade
# and the peer's python from bin/): the bundle first, then the image's packages, then this tree.
"$PY" -m venv --without-pip "$VENV" || exit 3
VENV_SITE=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
printf 'import site; site.addsitedir("%s"); site.addsitedir("%s")\n%s\n%s\n%s\n%s\n' \
  "$SITE" "$BASE_SITE" "$PWD/clients" "$PWD/service" "$PWD/facade" "$PWD" \
  > "$VENV_SITE/vlmserve-accelerator.pth"
while read -r name module; do
  printf '#!%s\nimport sys\nfrom %s import main\nsys.exit(main())\n' "$VENV/bin/python" "$module" > "$VENV/bin/$name"
  chmod +x "$VENV/bin/$name"
done <<'SCRIPTS'
vlmserve-engine vlmserve.engine.cli
vlmserve-facade vlmserve.facade.cli
SCRIPTS
# bench/peers.py runs its mlx-vlm target as peers/mlx-vlm/bin/python: this venv (its pyvenv.cfg).
ln -s "$VENV" "$ROOT/peers/mlx-vlm"
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1
exec "$VENV/bin/python" -m bench.accelerator --peers-root "$ROOT/peers" --work-dir "$ROOT/models" "$@"
