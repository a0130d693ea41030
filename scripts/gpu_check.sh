#!/usr/bin/env bash
# One prepared GPU check of the memory tier, for a bare CUDA machine (Python 3.12, torch, Triton;
# no Ray, vLLM, FAISS or internet). Budget: under 8 minutes on one H100/H200-class GPU.
#
#   scripts/gpu_check.sh --fetch-wheels   # here, with pip and internet: pydantic wheels -> .whl/
#   scripts/gpu_check.sh --cpu-dry-run    # here, no GPU: the same steps on the CPU, small sizes
#   scripts/gpu_check.sh                  # on the GPU machine (carry .whl/ with the tree)
#
# Steps (scripts/gpu_check.py, each under its own time limit; a failed step does not stop the rest):
#   imports  the check's modules import with faiss/ray/vllm blocked
#   pytest   tests/gpu: compiled Triton kernel vs the torch reference (GPU and CPU)
#   kernels  kernel benchmark: ms, GB/s and share of the HBM datasheet peak (fp32, fp16, bf16; 1M x 384)
#   memory   bench memory on CUDA: fused vs unfused torch (and FAISS rows when faiss exists), fp32/fp16
#   shard    a device-resident MemoryShard (fp32, fp16) against a CPU shard on the torch reference
#
# Figures land in $OUT when set (the device tool brings them back), else gpu-check-results/<UTC stamp>/:
# gpu_check.log plus one JSON file per step (at most 8 files). Exit status: 0 all passed, 1 a step
# failed, 3 no CUDA device (and not --cpu-dry-run), 4 pydantic missing and no wheels to install.
set -u -o pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD
PY=${PYTHON:-python3}
WHEELS=$ROOT/.whl
MODE=gpu
case "${1:-}" in
  --cpu-dry-run) MODE=cpu ;;
  --fetch-wheels) MODE=fetch ;;
  "") ;;
  -h|--help) sed -n 2,19p "$0"; exit 0 ;;
  *) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
esac

if [ "$MODE" = fetch ]; then
  # NOTE: pydantic-core is compiled: these are CPython 3.12 x86-64 manylinux wheels, the GPU machine's
  # Python; the rest are pure Python. Versions pinned to what the project is tested with.
  mkdir -p "$WHEELS"
  "$PY" -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$WHEELS" \
    pydantic==2.13.4 pydantic-core==2.46.4 annotated-types==0.7.0 typing-inspection==0.4.2 \
    typing-extensions==4.16.0 || exit 1
  ls -l "$WHEELS"
  exit 0
fi

OUT_DIR=${OUT:-$ROOT/gpu-check-results/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT_DIR"
LOG=$OUT_DIR/gpu_check.log
exec > >(tee -a "$LOG") 2>&1
# NOTE: the GPU machine runs the checkout without installing it. The import package `recallserve` is
# mapped from the top-level folders (pyproject's package-dir); a folder of links gives the same names.
# The checkout's root stays on the path, behind them, for `tests` and `scripts`.
NS=$(mktemp -d /tmp/recallserve-ns.XXXX)
mkdir "$NS/recallserve"
for d in kernels memory_shards serve deployments; do ln -s "$ROOT/$d" "$NS/recallserve/$d"; done
export PYTHONUNBUFFERED=1 PYTHONPATH="$NS:$ROOT${PYTHONPATH:+:$PYTHONPATH}"
echo "gpu_check: mode=$MODE out=$OUT_DIR start=$(date -u +%FT%TZ)"

if ! "$PY" -c "import pydantic" 2>/dev/null; then
  if ! ls "$WHEELS"/pydantic_core-*.whl >/dev/null 2>&1; then
    echo "gpu_check: pydantic is not installed and $WHEELS has no wheels: run --fetch-wheels where pip works, carry .whl" >&2
    exit 4
  fi
  SITE=$(mktemp -d /tmp/recallserve-site.XXXX)
  "$PY" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target "$SITE" "$WHEELS"/*.whl || exit 4
  export PYTHONPATH="$PYTHONPATH:$SITE"
fi
"$PY" - <<'EOF' || exit 4
import platform, sys
import numpy, pydantic, torch
try:
    import triton
    tv = triton.__version__
except ImportError:
    tv = None
print(f"python {platform.python_version()} torch {torch.__version__} triton {tv} numpy {numpy.__version__} "
      f"pydantic {pydantic.VERSION} cuda {torch.cuda.is_available()}"
      + (f" device {torch.cuda.get_device_name()}" if torch.cuda.is_available() else ""))
EOF

if [ "$MODE" = gpu ] && ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu_check: torch sees no CUDA device; on a machine without one run scripts/gpu_check.sh --cpu-dry-run" >&2
  exit 3
fi

FLAGS=()
[ "$MODE" = cpu ] && FLAGS=(--cpu)
FAILED=()
# name, seconds: the limits add up to 7.5 minutes (compiles and data generation included).
for step in imports:30 pytest:135 kernels:90 memory:150 shard:45; do
  name=${step%%:*} limit=${step##*:}
  echo "== $name (limit ${limit}s) $(date -u +%T)"
  start=$SECONDS
  timeout --signal=TERM --kill-after=5 "$limit" "$PY" scripts/gpu_check.py "$name" --out "$OUT_DIR" "${FLAGS[@]}"
  code=$?
  echo "== $name: exit $code in $((SECONDS - start))s"
  [ "$code" -eq 0 ] || FAILED+=("$name($code)")
done
echo "gpu_check: done $(date -u +%FT%TZ); failed: ${FAILED[*]:-none}; files in $OUT_DIR"
[ ${#FAILED[@]} -eq 0 ]
