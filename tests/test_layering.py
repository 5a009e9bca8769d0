"""Project rules that code review would otherwise have to remember."""

import ast
import json
import pathlib
import re
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


# ---- the layer diagram of docs/architecture.md -------------------------------------------------------
LAYERS_MARKER = "<!-- layers:"


def _layer_rows() -> list[list[str]]:
    """The diagram's rows, top first: the names before the description (3+ spaces) on each line."""
    text = (ROOT / "docs" / "architecture.md").read_text()
    block = text[text.index(LAYERS_MARKER):].split("```")[1]
    return [re.split(r"\s{3,}", line.strip(), maxsplit=1)[0].split() for line in block.strip().splitlines()]


def _top_level(module: str) -> str | None:
    """``kvlab.device.budget`` -> ``device``; None for anything outside kvlab (or ``kvlab`` itself)."""
    parts = module.split(".")
    return parts[1] if parts[0] == "kvlab" and len(parts) > 1 else None


def _kvlab_units() -> dict[str, list[pathlib.Path]]:
    units: dict[str, list[pathlib.Path]] = {}
    for path in sorted((ROOT / "kvlab").rglob("*.py")):
        rel = path.relative_to(ROOT / "kvlab")
        if rel == pathlib.Path("__init__.py"):
            continue
        units.setdefault(rel.parts[0].removesuffix(".py"), []).append(path)
    return units


def _resolved_imports(path: pathlib.Path):
    """(line, absolute module) for every import in ``path``, relative ones resolved against its package."""
    package = list(path.relative_to(ROOT).with_suffix("").parts[:-1])
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                yield node.lineno, ".".join(base + ([node.module] if node.module else []))
            elif node.module:
                yield node.lineno, node.module


def test_layer_diagram_names_every_package_once():
    rows = _layer_rows()
    named = [name for row in rows for name in row]
    assert len(named) == len(set(named)), f"docs/architecture.md's layer diagram names a package twice: {named}"
    missing = sorted(set(_kvlab_units()) - set(named))
    assert not missing, f"not in docs/architecture.md's layer diagram: {', '.join(missing)} (give each a row)"
    stale = sorted(set(named) - set(_kvlab_units()))
    assert not stale, f"docs/architecture.md's layer diagram names {', '.join(stale)}, which kvlab/ does not have"


def test_imports_only_point_down_the_layer_diagram():
    """A module imports from the rows below its own, never from its row or above (imports inside functions too)."""
    rank = {name: depth for depth, row in enumerate(_layer_rows()) for name in row}  # 0 = top row
    offenders = []
    for unit, paths in _kvlab_units().items():
        for path in paths:
            for line, module in _resolved_imports(path):
                target = _top_level(module)
                if target is None or target == unit or target not in rank or unit not in rank:
                    continue
                if rank[target] <= rank[unit]:
                    offenders.append(f"{path.relative_to(ROOT)}:{line} ({unit}) imports {module} ({target})")
    assert not offenders, "imports against docs/architecture.md's layer diagram:\n" + "\n".join(offenders)


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
