#!/usr/bin/env bash
# The whole test suite: installs what the tests need (the locked pip packages, Debian's chromium for the
# browser tests, the SGLang reference environment for differential tests) and runs pytest.
#
#   bash scripts/test.sh                 # pinned versions from requirements/lock.txt
#   bash scripts/test.sh --latest        # the newest versions pyproject.toml allows (or KVLAB_LATEST=1)
#   bash scripts/test.sh -- tests/viz    # anything else is passed to pytest
set -euo pipefail
cd "$(dirname "$0")/.."
install_args=()
pytest_args=()
for arg in "$@"; do
  case "$arg" in
    --latest) install_args+=(--latest) ;;
    *) pytest_args+=("$arg") ;;
  esac
done
bash scripts/install.sh "${install_args[@]}"
if [ ! -x /usr/bin/chromium ]; then
  if [ "$(id -u)" = 0 ]; then apt-get update -qq && apt-get install -y -qq chromium >/dev/null
  else sudo apt-get update -qq && sudo apt-get install -y -qq chromium >/dev/null; fi
fi
# SGLang's own classes for the differential tests, in venvs of their own (built once per machine).
export KVLAB_REF_DIR="${KVLAB_REF_DIR:-$HOME/.cache/kvlab/ref}"
bash .ci/setup_reference.sh
export KVLAB_REQUIRE_BROWSER="${KVLAB_REQUIRE_BROWSER:-1}"
# Lint first (rules in pyproject.toml's [tool.ruff]): a lint error fails the run before the long tests start.
python3 -m ruff check
set +e
# Every core, one worker each (pytest-xdist); a file's tests, and the tests sharing a session fixture, stay on one
# worker (tests/conftest.py::xdist_unit). `-n 0` (or `-p no:xdist`) runs them in this one process.
parallel=(-n auto)
for arg in "${pytest_args[@]}"; do
  case "$arg" in -n|-n*|--numprocesses*|no:xdist) parallel=() ;; esac
done
python3 -m pytest "${parallel[@]}" "${pytest_args[@]}"
rc=$?
set -e
if [ "$rc" = 5 ]; then echo "pytest collected no tests: failing" >&2; exit 1; fi
exit "$rc"
