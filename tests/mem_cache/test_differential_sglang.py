"""Differential test: kvlab's RadixCache + allocators against SGLang's own classes.

The same seeded op scripts (``op_script.random_scenario``: page sizes 1 and 4, every policy) run
through kvlab in-process and through ``tests/reference/sglang_driver.py`` inside SGLang's reference
venvs (built by ``.ci/setup_reference.sh``), and every per-op record must be identical: match
lengths and slots, eviction counts, allocation success and slots, evictable / protected /
available / total sizes.

- SGLang 0.5.23 (shortfall eviction) vs ``mode="shortfall"``.
- SGLang 0.5.16 (full-``num_tokens`` eviction) vs ``mode="full"``. Slots handed out are compared at
  page size 1 only: 0.5.16's evict frees a paged leaf through ``free()`` (pages sorted by
  ``torch.unique``), 0.5.23 and kvlab through ``free_segment()`` (row order), so later paged
  allocations legitimately get other page ids.

A missing venv skips with a message naming the setup script; ``KVLAB_REQUIRE_REFERENCE=1`` (CI)
turns that into a failure.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from .op_script import POLICIES, random_scenario, run_kvlab

REPO = Path(__file__).resolve().parents[2]
DRIVER = REPO / "tests" / "reference" / "sglang_driver.py"
MODES = {"0.5.23": "shortfall", "0.5.16": "full"}
SEEDS = range(3)
PAGE_SIZES = (1, 4)
N_OPS = 150

pytestmark = pytest.mark.slow


def reference_python(version: str) -> Path:
    """``$KVLAB_REF_DIR/sglang-<version>/bin/python``; KVLAB_REF_DIR defaults to ``<repo>/.ref``."""
    return Path(os.environ.get("KVLAB_REF_DIR", REPO / ".ref")) / f"sglang-{version}" / "bin" / "python"


def require_reference(version: str) -> Path:
    py = reference_python(version)
    if py.exists():
        return py
    msg = f"SGLang {version} reference venv missing ({py}); build it with .ci/setup_reference.sh"
    if os.environ.get("KVLAB_REQUIRE_REFERENCE") == "1":
        pytest.fail(msg + " (KVLAB_REQUIRE_REFERENCE=1)")
    pytest.skip(msg)


def scenarios() -> list[dict]:
    return [random_scenario(1000 * s + ps, ps, policy, n_ops=N_OPS)
            for s in SEEDS for ps in PAGE_SIZES for policy in POLICIES]


@pytest.fixture(scope="module")
def reference_runs(tmp_path_factory):
    """Start every available reference venv at once, in the background (SGLang's import alone takes
    ~20 s); the spec and the results go through files so no pipe blocks either side."""
    work = tmp_path_factory.mktemp("sglang_ref")
    spec = work / "spec.json"
    spec.write_text(json.dumps({"scenarios": scenarios(), "record_indices": True}))
    procs = {}
    for version in MODES:
        py = reference_python(version)
        if py.exists():
            with open(spec) as stdin, open(work / f"{version}.out", "w") as out, open(work / f"{version}.err", "w") as err:
                procs[version] = subprocess.Popen([str(py), str(DRIVER), "--ops"], stdin=stdin, stdout=out,
                                                  stderr=err, cwd=REPO)
    results = {}

    def get(version):
        if version not in results:
            p = procs[version]
            p.wait(timeout=600)
            err = (work / f"{version}.err").read_text()
            assert p.returncode == 0, f"sglang {version} driver failed:\n{err[-4000:]}"
            data = json.loads((work / f"{version}.out").read_text())
            assert data["version"] == version
            results[version] = data["results"]
        return results[version]

    yield get
    for p in procs.values():
        if p.poll() is None:
            p.kill()


def first_mismatch(scs, ref, mine, compare_paged_slots: bool):
    for sc, a, b in zip(scs, ref, mine):
        for i, (x, y) in enumerate(zip(a, b)):
            if not compare_paged_slots and sc["page_size"] > 1:
                x, y = dict(x), dict(y)
                x.pop("idx", None)
                y.pop("idx", None)
            if x != y:
                return (f"page_size={sc['page_size']} policy={sc['policy']} op #{i} {sc['ops'][i]}\n"
                        f"  sglang: {x}\n  kvlab:  {y}")
        if len(a) != len(b):
            return f"record counts differ: {len(a)} vs {len(b)}"
    return None


@pytest.mark.parametrize("version", list(MODES))
def test_kvlab_matches_sglang_op_for_op(version, reference_runs):
    require_reference(version)
    scs = scenarios()
    mine = run_kvlab(scs, MODES[version])  # in-process, with every check_invariants() after each op
    ref = reference_runs(version)
    assert len(ref) == len(scs)
    problem = first_mismatch(scs, ref, mine, compare_paged_slots=version != "0.5.16")
    assert problem is None, f"kvlab (mode={MODES[version]!r}) differs from SGLang {version}:\n{problem}"


def test_the_scripts_exercise_what_they_compare():
    """The comparison is only as strong as the scripts: they must evict, fail allocations, split
    nodes and hit the cache, under every policy and both page sizes."""
    runs = run_kvlab(scenarios(), "shortfall", check=False)
    recs = [r for sc in runs for r in sc]
    assert sum(r.get("evicted", 0) > 0 for r in recs) > 200
    assert sum(r.get("ok") is False for r in recs) > 50
    assert sum(r.get("hit", 0) > 0 for r in recs) > 500
    assert sum(r["pr"] > 0 for r in recs) > 500


def test_the_two_versions_disagree_where_the_bug_bites(reference_runs):
    """SGLang 0.5.16 and 0.5.23 differ on these scripts, and kvlab's mode is the whole difference:
    kvlab in the wrong mode does not match either version."""
    for version in MODES:
        require_reference(version)
    scs = scenarios()
    old, new = reference_runs("0.5.16"), reference_runs("0.5.23")
    assert first_mismatch(scs, old, new, compare_paged_slots=False) is not None
    wrong = run_kvlab(scs, "full", check=False)
    assert first_mismatch(scs, new, wrong, compare_paged_slots=False) is not None
