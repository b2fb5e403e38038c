#!/usr/bin/env bash
# Set up torchtune 0.6.1 in its own venv for bench/sft_throughput.py (the peer it compares against).
#   bash bench/torchtune_env.sh            # creates bench/.venv-torchtune (ignored by git)
# torch goes in first, from the same wheel as the project's (so both sides run the same kernels),
# then torchtune 0.6.1 with the torchao it supports (0.15.0), from the package index.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$here/.venv-torchtune"
python="${PYTHON:-python3}"
wheel_dir="${TORCH_WHEEL_DIR:-/opt/wheels}"

if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c "import torchtune, torchao" 2>/dev/null; then
    echo "torchtune venv ready: $venv"
    exit 0
fi
"$python" -m venv "$venv"
"$venv/bin/pip" install -q --upgrade pip
torch_wheel="$(ls "$wheel_dir"/torch-2.13.0*.whl 2>/dev/null | head -n1 || true)"
if [[ -n "$torch_wheel" ]]; then
    "$venv/bin/pip" install -q "$torch_wheel"
else
    "$venv/bin/pip" install -q "torch==2.13.0" --index-url https://download.pytorch.org/whl/cpu
fi
"$venv/bin/pip" install -q "torchtune==0.6.1" "torchao==0.15.0"
"$venv/bin/python" -c "import torch, torchtune, torchao; print('torch', torch.__version__, 'torchtune', torchtune.__version__, 'torchao', torchao.__version__)"
