"""Project rules that code review would otherwise have to remember."""

import ast
import json
import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]
CORE_FORBIDDEN = ("plotly", "ipywidgets", "anywidget")


def _imports(path: pathlib.Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.lineno, node.module


def test_only_viz_imports_plotly_or_widgets():
    offenders = []
    for path in (ROOT / "kvlab").rglob("*.py"):
        if "viz" in path.relative_to(ROOT / "kvlab").parts:
            continue
        for line, module in _imports(path):
            if module.split(".")[0] in CORE_FORBIDDEN:
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not offenders, offenders


def test_importing_the_core_loads_no_plotting_library():
    code = ("import sys, kvlab.device, kvlab.model, kvlab.experiments.kv_pool_sizing, kvlab.cli; "
            f"print([m for m in {CORE_FORBIDDEN!r} if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_notebooks_are_committed_without_outputs_and_paired():
    notebooks = sorted((ROOT / "notebooks").glob("*.ipynb"))
    assert notebooks
    for nb_path in notebooks:
        nb = json.loads(nb_path.read_text())
        for i, cell in enumerate(nb["cells"]):
            if cell["cell_type"] == "code":
                assert not cell.get("outputs"), f"{nb_path.name} cell {i} has outputs: strip them"
                assert cell.get("execution_count") is None, f"{nb_path.name} cell {i} has an execution count"
        assert nb_path.with_suffix(".py").exists(), f"{nb_path.name} has no jupytext py:percent twin"
        assert "py:percent" in nb["metadata"].get("jupytext", {}).get("formats", ""), nb_path.name


def test_paired_scripts_match_their_notebooks():
    import jupytext

    for nb_path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        from_ipynb = [c.source for c in jupytext.read(nb_path).cells]
        from_py = [c.source for c in jupytext.read(nb_path.with_suffix(".py")).cells]
        assert from_ipynb == from_py, f"{nb_path.name} and its .py twin differ: run jupytext --sync"


def test_the_teaching_layer_sits_on_top():
    """kvlab.labs (lab steps and exercises) runs the experiments; no other kvlab module imports it (notebooks
    and tests do)."""
    offenders = []
    for path in (ROOT / "kvlab").rglob("*.py"):
        if path.relative_to(ROOT / "kvlab").parts[0] == "labs":
            continue
        for line, module in _imports(path):
            if module == "kvlab.labs" or module.startswith("kvlab.labs."):
                offenders.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not offenders, offenders


def test_no_bare_gc_disable_in_labs_experiments_or_notebooks():
    """Pausing the automatic collector goes through kvlab.device.measure.automatic_gc_paused(), which always
    switches it back on."""
    paths = [*(ROOT / "kvlab" / "labs").rglob("*.py"), *(ROOT / "kvlab" / "experiments").rglob("*.py"),
             *(ROOT / "notebooks").glob("*.py")]
    assert paths
    offenders = [str(p.relative_to(ROOT)) for p in paths if "gc.disable(" in p.read_text()]
    assert not offenders, offenders
