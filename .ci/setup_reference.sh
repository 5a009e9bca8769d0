#!/usr/bin/env bash
# Build the SGLang reference environments that tests/mem_cache/test_differential_sglang.py and
# benchmarks/bench_{radix_cache,eviction}.py drive through tests/reference/sglang_driver.py.
#
#   .ref/sglang-0.5.23   newest wheel: shortfall eviction (evict_from_tree_cache, PR #32016)
#   .ref/sglang-0.5.16   last wheel with the full-num_tokens eviction bug
#
# KVLAB_REF_DIR moves .ref/ elsewhere (the tests and benchmarks read the same variable), e.g. a
# cache folder that outlives a fresh CI clone, so the venvs are built once per machine.
#
# Each is its own venv: CPU torch 2.13.0 (pinned by a constraints file so nothing upgrades it),
# sglang installed --no-deps, and only the import-time dependencies that sglang.srt.mem_cache
# pulls in (see docs/testing.md#differential-tests-against-sglang). torchvision is NOT installed:
# PyPI's builds fail against the CPU torch, so the driver installs a stub module before importing sglang.
#
# Idempotent: a venv whose driver self-check passes is kept (~40 s per venv to check). About
# 2.5 GB per venv; both from a cold pip cache took ~10 min on a 2-core machine (triton is ~1 GB),
# 3-4 min per venv with pip's cache warm. SGLANG_REF_VERSIONS="0.5.23" narrows the versions.
set -euo pipefail

root=$(cd "$(dirname "$0")/.." && pwd)
ref=${KVLAB_REF_DIR:-$root/.ref}
py=${PYTHON:-python3}
versions=${SGLANG_REF_VERSIONS:-"0.5.23 0.5.16"}
driver="$root/tests/reference/sglang_driver.py"

deps=(numpy orjson psutil pybase64 requests triton packaging pillow starlette msgspec pydantic
      pyzmq tqdm ipython aiohttp apache-tvm-ffi==0.1.11 dill sentencepiece==0.2.1
      compressed-tensors==0.18.0 gguf)
# Per version: the transformers each wheel pins (5.19 breaks 0.5.16's config registry: "'qwen3_asr'
# is already used"), and what 0.5.16's import chain adds (server_args -> function_call ->
# openai / partial_json_parser / xgrammar; moe_runner -> einops).
version_deps() {
  case "$1" in
    0.5.16) echo "transformers==5.12.1 openai==2.6.1 partial_json_parser xgrammar==0.2.1 einops" ;;
    *) echo "transformers==5.19.0 openai==2.8.0 partial_json_parser" ;;  # openai: UnifiedRadixCache's import chain
  esac
}
# Run a pip command, dropping known noise (the machine's pip config lists local index folders that
# may be absent; sglang's own pins that the constraints override), keeping its exit status.
quiet() {
  local log rc=0
  log=$(mktemp)
  "$@" >"$log" 2>&1 || rc=$?
  grep -v -e '^WARNING: Location' -e ' requires ' -e 'dependency resolver' "$log" || true
  rm -f "$log"
  return "$rc"
}

mkdir -p "$ref/wheels"
constraints="$ref/constraints.txt"
echo "torch==2.13.0" >"$constraints"

for v in $versions; do
  venv="$ref/sglang-$v"
  if [ -x "$venv/bin/python" ] && "$venv/bin/python" "$driver" --check >/dev/null 2>&1; then
    echo "[setup_reference] $venv: ok (kept)"
    continue
  fi
  echo "[setup_reference] building $venv"
  rm -rf "$venv"
  "$py" -m venv "$venv"
  quiet "$venv/bin/pip" install -q -c "$constraints" torch==2.13.0
  wheel=$(ls "$ref/wheels"/sglang-"$v"-*.whl 2>/dev/null | head -n 1 || true)
  if [ -z "$wheel" ]; then
    quiet "$venv/bin/pip" download -q --no-deps "sglang==$v" -d "$ref/wheels"
    wheel=$(ls "$ref/wheels"/sglang-"$v"-*.whl | head -n 1)
  fi
  quiet "$venv/bin/pip" install -q --no-deps "$wheel"
  # sglang pins another torch; the constraint keeps 2.13.0, so pip's complaints are expected.
  # shellcheck disable=SC2046
  quiet "$venv/bin/pip" install -q -c "$constraints" "${deps[@]}" $(version_deps "$v")
  "$venv/bin/python" "$driver" --check
done
echo "[setup_reference] done: $(cd "$ref" && ls -d sglang-*/ | tr '\n' ' ')"
