#!/usr/bin/env bash
# Refresh the lock: resolve pyproject.toml's runtime and test dependencies (plus requirements/torch-cpu.txt) to
# exact versions with hashes in requirements/lock.txt, and regenerate environment.yml's pins from it.
# Upgrading dependencies is a deliberate step: run this, then `bash scripts/test.sh`, and commit both files.
#
#   bash scripts/lock.sh            # newest versions that pyproject.toml allows
#   bash scripts/lock.sh -P plotly  # upgrade one package, keep the rest (any pip-compile option passes through)
set -euo pipefail
cd "$(dirname "$0")/.."
PIP_TOOLS_VERSION=7.5.2
tools=${KVLAB_LOCK_VENV:-${TMPDIR:-/tmp}/kvlab-lock-venv}
if ! "$tools/bin/pip-compile" --version 2>/dev/null | grep -q "$PIP_TOOLS_VERSION"; then
  python3 -m venv "$tools"
  "$tools/bin/pip" install -q "pip-tools==$PIP_TOOLS_VERSION"
fi
# pip-compile keeps existing pins unless told to upgrade: a plain refresh upgrades everything.
upgrade=(--upgrade)
[ "$#" -gt 0 ] && upgrade=()
CUSTOM_COMPILE_COMMAND="bash scripts/lock.sh" "$tools/bin/pip-compile" --quiet --generate-hashes --allow-unsafe \
  --strip-extras --extra test --no-emit-index-url --no-emit-find-links "${upgrade[@]}" "$@" \
  --output-file requirements/lock.txt pyproject.toml requirements/torch-cpu.txt
python3 scripts/lockfile.py --finish requirements/lock.txt environment.yml
echo "lock: $(grep -c '^[a-z0-9]' requirements/lock.txt) packages pinned in requirements/lock.txt; environment.yml regenerated"
