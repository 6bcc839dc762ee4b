#!/usr/bin/env bash
# Set up electra-ablate in ./.venv: `bash setup.sh`, then `. .venv/bin/activate`.
#
# torch: on a machine without an NVIDIA GPU, the CPU build (torch==2.13.0, which this project is tested
# with) is installed first so that nothing pulls several GB of CUDA packages. On a GPU machine, or when
# torch is already importable in the venv, your own torch build is left alone; TORCH_SPEC overrides, e.g.
# TORCH_SPEC="torch==2.13.0+cu128 --index-url <your wheel index>".
set -euo pipefail
cd "$(dirname "$0")"
PYTHON="${PYTHON:-python3}"
[ -d .venv ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
if [ -n "${TORCH_SPEC:-}" ]; then
  # shellcheck disable=SC2086
  python -m pip install -q $TORCH_SPEC
elif ! python -c "import torch" 2>/dev/null && ! command -v nvidia-smi >/dev/null 2>&1; then
  python -m pip install -q "torch==2.13.0"
fi
python -m pip install -q -e ".[dev,hf]"
python -c "import torch, electra_ablate; print('electra-ablate ready: torch', torch.__version__, '| CUDA', torch.cuda.is_available())"
