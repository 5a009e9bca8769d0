#!/usr/bin/env bash
# The main job: install kvlab and open JupyterLab on the notebooks.
# Headless reproductions afterwards: `kvlab repro kv-pool-sizing --preset sglang-pr-4xh200 --no-gc-before-measure`.
set -euo pipefail
cd "$(dirname "$0")/.."
# Keep an installed torch (a GPU box has its own CUDA build); otherwise take the tested 2.13.0.
python3 -c "import torch" 2>/dev/null || python3 -m pip install torch==2.13.0
python3 -m pip install -e .
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-root)  # e.g. in a container
exec jupyter lab notebooks/ "${extra[@]}" "$@"
