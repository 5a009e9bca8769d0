#!/usr/bin/env bash
# Install kvlab and its dependencies from the lock (scripts/lab.sh and scripts/test.sh call this).
#
#   bash scripts/install.sh            # the pinned, tested versions: requirements/lock.txt (hash-checked)
#   bash scripts/install.sh --latest   # the newest versions pyproject.toml allows (KVLAB_LATEST=1 does the same),
#                                      # to find upstream breakage on purpose; then `bash scripts/lock.sh` to adopt
#
# torch: an installed torch is kept (a GPU box keeps its CUDA build); otherwise the CPU build pinned in
# requirements/torch-cpu.txt, from this machine's wheel folder or PyTorch's CPU index.
set -euo pipefail
cd "$(dirname "$0")/.."
latest=${KVLAB_LATEST:-0}
for arg in "$@"; do
  case "$arg" in
    --latest) latest=1 ;;
    *) echo "install.sh: unknown option $arg (use --latest)" >&2; exit 2 ;;
  esac
done
pip=(python3 -m pip install -q --disable-pip-version-check --root-user-action=ignore)
# pip prints a WARNING line for each local index folder of this machine's pip config that does not exist.
quiet() { "$@" 2> >(grep -v "^WARNING: Location '" >&2); }

if torch_version=$(python3 -W ignore -c "import torch; print(torch.__version__)" 2>/dev/null); then
  echo "[install] keeping the installed torch $torch_version"
else
  echo "[install] torch: $(grep -E '^torch==' requirements/torch-cpu.txt)"
  quiet "${pip[@]}" -r requirements/torch-cpu.txt \
    || quiet "${pip[@]}" -r requirements/torch-cpu.txt --extra-index-url https://download.pytorch.org/whl/cpu
  torch_version=$(python3 -W ignore -c "import torch; print(torch.__version__)")
fi

if [ "$latest" = 1 ]; then
  echo "[install] --latest: resolving the newest versions pyproject.toml allows (torch stays $torch_version)"
  constraint=$(mktemp)
  echo "torch==$torch_version" >"$constraint"
  quiet "${pip[@]}" --upgrade --upgrade-strategy eager -c "$constraint" -e ".[test]"
  rm -f "$constraint"
  python3 -m pip list --format=freeze 2>/dev/null | grep -iE '^(pandas|plotly|pytest|jupyterlab|voila|ipywidgets)==' \
    | tr '\n' ' ' | sed 's/^/[install] now: /'; echo
else
  echo "[install] requirements/lock.txt ($(grep -c '^[a-z0-9]' requirements/lock.txt) pinned packages, hash-checked)"
  quiet "${pip[@]}" --require-hashes -r requirements/lock.txt
  quiet "${pip[@]}" --no-deps --no-build-isolation -e .
fi
