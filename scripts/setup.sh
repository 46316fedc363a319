#!/usr/bin/env bash
# Install bertcli (editable) and what it needs, without pulling CUDA builds of torch onto CPU machines.
#   bash scripts/setup.sh          # the tool
#   bash scripts/setup.sh --test   # the tool plus the test dependencies (pytest, transformers)
# A machine that already has torch (a GPU box, say) keeps its own build.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  if command -v nvidia-smi >/dev/null 2>&1; then
    "$PY" -m pip install -q torch  # a GPU machine: the default CUDA build
  else
    # A CPU machine: a CPU build. TORCH_SPEC may name another one (a wheel file, or a version
    # together with --index-url of PyTorch's CPU wheels).
    "$PY" -m pip install -q ${TORCH_SPEC:-torch==2.13.0}
  fi
fi
extras=""
[ "${1:-}" = "--test" ] && extras="[test]"
"$PY" -m pip install -q -e ".${extras}"
"$PY" -c "import torch, bertcli; print(f'bertcli {bertcli.__version__} with torch {torch.__version__}')" >&2
