"""Shipped files are found through kvlab.paths: in this checkout, through the override variables, and no module
under kvlab/ looks for them by climbing out of its own folder (which breaks in an installed wheel)."""

from __future__ import annotations

import ast
import pathlib

from kvlab import paths
from kvlab.device.snapshot import EXAMPLE_SNAPSHOT
from kvlab.experiments import eviction_regimes, kv_pool_sizing, pool_sweep
from kvlab.report import DEFAULT_NOTEBOOK_DIR

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_a_checkout_uses_its_own_data_and_notebooks(monkeypatch):
    monkeypatch.delenv(paths.DATA_ENV, raising=False)
    monkeypatch.delenv(paths.NOTEBOOK_ENV, raising=False)
    assert not paths.SHIPPED_DIR.exists(), "kvlab/_shipped is a wheel's copy: never create it in a checkout"
    assert paths.data_dir() == ROOT / "data" and paths.notebook_dir() == ROOT / "notebooks"
    assert paths.data_path("traces", "mooncake_tiny.jsonl").is_file()


def test_the_modules_constants_are_the_shipped_files():
    assert EXAMPLE_SNAPSHOT == ROOT / "data" / "snapshots" / "example.pickle" and EXAMPLE_SNAPSHOT.is_file()
    assert kv_pool_sizing.DATA_DIR == ROOT / "data"
    assert (pathlib.Path(kv_pool_sizing.TINY_H100.checkpoint_dir) / "model.safetensors").is_file()
    assert pool_sweep.EXAMPLE_TRACE.is_file() and (eviction_regimes.TRACE_DIR / "mooncake_small.jsonl").is_file()
    assert DEFAULT_NOTEBOOK_DIR == ROOT / "notebooks"


def test_the_variables_override_both(monkeypatch, tmp_path):
    monkeypatch.setenv(paths.DATA_ENV, str(tmp_path / "mine"))
    monkeypatch.setenv(paths.NOTEBOOK_ENV, str(tmp_path / "nbs"))
    assert paths.data_path("traces", "t.jsonl") == tmp_path / "mine" / "traces" / "t.jsonl"
    assert paths.notebook_dir() == tmp_path / "nbs"


def test_no_module_climbs_out_of_the_package():
    """``Path(__file__).parents[N]`` (or ``.parent.parent``) from a module finds the checkout, not a wheel."""
    offenders = []
    for path in sorted((ROOT / "kvlab").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            text = ast.unparse(node) if isinstance(node, ast.Attribute | ast.Subscript) else ""
            if "__file__" in text and (".parents" in text or ".parent.parent" in text):
                offenders.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not offenders, "find shipped files with kvlab.paths: " + ", ".join(sorted(set(offenders)))
