#!/usr/bin/env bash
# The main job: install kvlab from the lock and open JupyterLab on the notebooks.
# Headless reproductions afterwards: `kvlab repro kv-pool-sizing --preset sglang-pr-4xh200 --no-gc-before-measure`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install.sh
extra=()
[ "$(id -u)" = 0 ] && extra+=(--allow-root)  # e.g. in a container
exec jupyter lab notebooks/ "${extra[@]}" "$@"
