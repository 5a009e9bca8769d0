"""Project rules that code review would otherwise have to remember."""

import ast
import json
import pathlib
import re
import subprocess
import sys
from functools import cache
from typing import NamedTuple

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



# ---- one-way imports between modules, and no private name across a module boundary ----------------------
# The graph counts every import: at module level, inside functions and under ``if TYPE_CHECKING:``. Relative
# imports are resolved, and ``from pkg import name`` is an edge to the submodule ``pkg.name`` when there is one
# (to ``pkg`` itself otherwise). Importing ``a.b.c`` does not count as an edge to ``a.b``'s ``__init__``: every
# package would then form a circle with its own modules.

def _module_name(path: pathlib.Path) -> str:
    """``kvlab/device/budget.py`` -> ``kvlab.device.budget``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_name(p): p for p in sorted((ROOT / "kvlab").rglob("*.py"))}


class Import(NamedTuple):
    line: int
    module: str  # the module imported: the edge of the graph
    name: str | None  # ``from module import name`` when ``name`` is not a module itself
    local: str  # the name the statement binds in the importing module...
    bound_to: str | None  # ...and the module that name stands for (None when it is a name taken from a module)


@cache
def _tree(module: str) -> ast.Module:
    return ast.parse(MODULES[module].read_text(), filename=str(MODULES[module]))


def imports_of(module: str) -> list[Import]:
    found = []
    package = module if MODULES[module].name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(_tree(module)):
        if isinstance(node, ast.Import):
            for alias in node.names:  # ``import a.b`` binds ``a``; ``import a.b as x`` binds ``x`` to a.b
                local = alias.asname or alias.name.split(".")[0]
                found.append(Import(node.lineno, alias.name, None, local, alias.name if alias.asname else local))
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # ``from ..x import y`` inside package a.b.c (level 2) -> a.b.x
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                local, submodule = alias.asname or alias.name, f"{base}.{alias.name}"
                found.append(Import(node.lineno, submodule, None, local, submodule) if submodule in MODULES
                             else Import(node.lineno, base, alias.name, local, None))
    return found


def import_graph() -> dict[str, dict[str, int]]:
    """module -> {kvlab module it imports: line of the first such import}."""
    graph: dict[str, dict[str, int]] = {}
    for module in MODULES:
        for imp in imports_of(module):
            if imp.module in MODULES and imp.module != module:
                graph.setdefault(module, {}).setdefault(imp.module, imp.line)
    return graph


def _shortest_path(graph: dict[str, dict[str, int]], start: str, goal: str) -> list[str] | None:
    """Breadth-first: the modules from ``start`` to ``goal`` along imports, or None when ``goal`` is not reached."""
    came_from: dict[str, str | None] = {start: None}
    queue = [start]
    for node in queue:
        if node == goal:
            path = [node]
            while (node := came_from[node]) is not None:
                path.append(node)
            return path[::-1]
        for target in graph.get(node, {}):
            if target not in came_from:
                came_from[target] = node
                queue.append(target)
    return None


def import_cycles(graph: dict[str, dict[str, int]]) -> list[tuple[str, ...]]:
    """For every import a -> b that lies on a circle, the shortest circle through it (a, b, ..., back to a);
    each circle once, starting from its alphabetically first module."""
    cycles = set()
    for a, targets in graph.items():
        for b in targets:
            back = _shortest_path(graph, b, a)
            if back:
                cycle = [a, *back[:-1]]
                first = cycle.index(min(cycle))
                cycles.add(tuple(cycle[first:] + cycle[:first]))
    return sorted(cycles, key=lambda c: (len(c), c))


def _where(module: str, line: int) -> str:
    return f"{MODULES[module].relative_to(ROOT)}:{line}"


def describe_cycle(graph: dict[str, dict[str, int]], cycle: tuple[str, ...]) -> str:
    edges = zip(cycle, cycle[1:] + cycle[:1])
    return " -> ".join((*cycle, cycle[0])) + "".join(
        f"\n    {_where(a, graph[a][b])} imports {b}" for a, b in edges)


def _is_private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dotted(node: ast.expr) -> str | None:
    """``a.b.c`` for a chain of attribute lookups on a plain name, else None."""
    if isinstance(node, ast.Attribute):
        base = _dotted(node.value)
        return f"{base}.{node.attr}" if base else None
    return node.id if isinstance(node, ast.Name) else None


# Private names of outside libraries' public API: a NamedTuple's methods, and any ``lib._x`` of a non-kvlab import.
NAMEDTUPLE_API = {"_replace", "_asdict", "_fields", "_make", "_field_defaults"}


def _names_defined_in(tree: ast.Module) -> set[str]:
    """What a module defines itself: functions, classes, variables, arguments and ``self.x = ...`` attributes."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.arg):
            names.add(node.arg)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            names.add(node.id)
        elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Store) and _dotted(node.value) in (
                "self", "cls"):
            names.add(node.attr)
    return names


def _instances_of_imported_classes(tree: ast.Module, imports: list[Import], module: str) -> dict[str, str]:
    """Local names the module binds to a new object of a class it imports from another kvlab module
    (``cache = RadixCache(...)``) -> ``kvlab.x.Class``."""
    classes = {imp.local: f"{imp.module}.{imp.name}" for imp in imports
               if imp.name and imp.module in MODULES and imp.module != module and imp.name[:1].isupper()}
    made = {}
    for node in ast.walk(tree):
        if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and isinstance(node.value.func, ast.Name)
                and node.value.func.id in classes):
            for target in node.targets:
                if isinstance(target, ast.Name):
                    made[target.id] = classes[node.value.func.id]
    return made


def private_reaches() -> list[tuple[str, int, str]]:
    """(module, line, what it reaches) for every private name one kvlab module takes from another:

    - ``from kvlab.x import _name`` -> ``kvlab.x._name``;
    - ``mod._name`` where ``mod`` is another kvlab module bound by an import of the file (``import kvlab.x as
      mod``, ``from kvlab import x``, ``import kvlab.x`` then ``kvlab.x._name``) -> ``kvlab.x._name``;
    - ``obj._name`` where ``obj`` is a name the module binds to a new object of a class imported from another kvlab
      module (``cache = RadixCache(...)``, then ``cache._next_id``) -> ``kvlab.x.Class._name``, whether or not the
      module defines a ``_name`` of its own;
    - ``obj._name`` on anything else but ``self`` / ``cls`` when the module itself never defines ``_name`` (so it
      belongs to an object of another module's class) -> the expression, e.g. ``sched._retract``. This one is
      a heuristic: it misses a reach whose name the module happens to define too.
    """
    found = set()
    for module in MODULES:
        tree, imports = _tree(module), imports_of(module)
        defined = _names_defined_in(tree)
        modules_bound = {imp.local: imp.bound_to for imp in imports if imp.bound_to}
        outside_kvlab = {imp.local for imp in imports if imp.module.split(".")[0] != "kvlab"}
        instances = _instances_of_imported_classes(tree, imports, module)
        for imp in imports:
            if imp.name and _is_private(imp.name) and imp.module in MODULES and imp.module != module:
                found.add((module, imp.line, f"{imp.module}.{imp.name}"))
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Attribute) and _is_private(node.attr)):
                continue
            chain = _dotted(node.value) or ""
            head, _, rest = chain.partition(".")
            target = ".".join(filter(None, (modules_bound.get(head), rest))) if head in modules_bound else None
            if target in MODULES:
                if target != module:
                    found.add((module, node.lineno, f"{target}.{node.attr}"))
            elif chain in instances:
                found.add((module, node.lineno, f"{instances[chain]}.{node.attr}"))
            elif (chain not in ("self", "cls") and node.attr not in defined and node.attr not in NAMEDTUPLE_API
                  and head not in outside_kvlab):
                found.add((module, node.lineno, ast.unparse(node)))
    return sorted(found)


def longest_functions(count: int = 10) -> list[tuple[int, str]]:
    """(lines, ``file:line qualified.name``) of the longest functions and methods of kvlab/, longest first."""
    found = []

    def visit(module: str, node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                name = f"{prefix}{child.name}"
                if not isinstance(child, ast.ClassDef):
                    found.append((child.end_lineno - child.lineno + 1, f"{_where(module, child.lineno)} {name}"))
                visit(module, child, f"{name}.")

    for module in MODULES:
        visit(module, _tree(module), "")
    return sorted(found, key=lambda f: (-f[0], f[1]))[:count]


def test_the_layer_table_says_what_each_package_imports():
    """docs/architecture.md's table row of each package lists exactly the kvlab packages it imports (rows that
    say it in words, like "the rest (not `viz`)", are not checked)."""
    imports: dict[str, set[str]] = {}
    for module, targets in import_graph().items():
        unit = _top_level(module)
        imports.setdefault(unit, set()).update(t for t in map(_top_level, targets) if t not in (None, unit))
    text = (ROOT / "docs" / "architecture.md").read_text()
    checked, wrong = 0, []
    for packages, said in re.findall(r"^\| (.+?) \| (.+?) \| .+ \|$", text, re.MULTILINE):
        if said != "nothing" and re.sub(r"`\w+`|,|;|only inside functions|\s", "", said):
            continue  # said in words
        claimed = set(re.findall(r"`(\w+)`", said))
        for package in re.findall(r"`(\w+)(?:/|\.py)?`", packages):
            checked += 1
            if imports.get(package, set()) != claimed:
                wrong.append(f"{package}: the table says {sorted(claimed) or 'nothing'}, "
                             f"it imports {sorted(imports.get(package, set())) or 'nothing'}")
    assert checked >= 10, f"only {checked} rows of docs/architecture.md's package table were read"
    assert not wrong, "docs/architecture.md's package table is out of date:\n" + "\n".join(wrong)


# TEMPORARY: circles and private reaches that other branches remove. Each branch's set goes when the branch is
# merged; the tests below fail on an entry that no longer matches anything, so the list cannot outlive its reason.
PENDING_CYCLES: dict[str, set[str]] = {}  # circles another branch is removing, by branch (none now)
PENDING_PRIVATE: dict[str, set[str]] = {}  # private reaches another branch is removing (none now)


def _pending(table: dict[str, set[str]]) -> dict[str, str]:
    return {entry: branch for branch, entries in table.items() for entry in entries}


def test_no_two_modules_import_each_other():
    """No circle in kvlab's module import graph (imports inside functions and under TYPE_CHECKING count):
    shared pieces move down into a module both can import, so every module reads without its importers."""
    graph = import_graph()
    cycles = {" -> ".join(cycle): cycle for cycle in import_cycles(graph)}
    pending = _pending(PENDING_CYCLES)
    new = [describe_cycle(graph, cycle) for key, cycle in cycles.items() if key not in pending]
    assert not new, "modules of kvlab/ that import each other (each import on the circle):\n" + "\n".join(new)
    stale = sorted(f"{key} (branch {branch})" for key, branch in pending.items() if key not in cycles)
    assert not stale, "PENDING_CYCLES lists circles that are gone: delete them\n" + "\n".join(stale)


def test_no_private_name_crosses_a_module_boundary():
    """A name with a leading underscore is used only in the module that defines it: another module that needs it
    gets a public name (or the piece moves down to a module both import)."""
    reaches = {}
    for module, line, what in private_reaches():
        reaches.setdefault(f"{module}: {what}", []).append(_where(module, line))
    pending = _pending(PENDING_PRIVATE)
    new = [f"{', '.join(where)} reaches {key.partition(': ')[2]}" for key, where in reaches.items()
           if key not in pending]
    assert not new, "private names used outside their module:\n" + "\n".join(new)
    stale = sorted(f"{key} (branch {branch})" for key, branch in pending.items() if key not in reaches)
    assert not stale, "PENDING_PRIVATE lists reaches that are gone: delete them\n" + "\n".join(stale)


# ---- the scheduler's memory: one written contract ------------------------------------------------------------------
def memory_contract_breaches() -> list[str]:
    """Where :class:`kvlab.sched.memory.SchedulerMemory` and a memory the scheduler runs on disagree: a method
    missing, or its parameters named or ordered otherwise (the loop's components call either memory alike)."""
    import inspect

    from kvlab.sched.kv import SchedulerKV
    from kvlab.sched.memory import SchedulerMemory
    from kvlab.sched.page_kv import PageKV

    wanted = {name: inspect.signature(fn) for name, fn in vars(SchedulerMemory).items()
              if callable(fn) and not name.startswith("_")}
    breaches = []
    for cls in (SchedulerKV, PageKV):
        for name, sig in wanted.items():
            have = getattr(cls, name, None)
            if have is None:
                breaches.append(f"{cls.__name__} has no {name}{sig}")
            elif list(inspect.signature(have).parameters) != list(sig.parameters):
                breaches.append(f"{cls.__name__}.{name}{inspect.signature(have)} is not {name}{sig}")
    return breaches


def test_both_scheduler_memories_keep_the_written_contract():
    assert memory_contract_breaches() == []
    from kvlab.sched import SchedulerConfig
    from kvlab.sched.ledger import Ledger
    from kvlab.sched.memory import SchedulerMemory
    from kvlab.sched.page_kv import PageKV
    from kvlab.sched.result import Totals

    # the attributes too: an instance of the page engine is a SchedulerMemory (runtime_checkable)
    assert isinstance(PageKV(SchedulerConfig(kv_tokens=4096, page_size=16), Ledger(Totals())), SchedulerMemory)


def report() -> str:
    """The figures issue 24 asks for: circles, private reaches (those still PENDING marked) and the ten longest
    functions. ``python3 tests/test_layering.py`` prints them."""
    graph, pending_cycles, pending_private = import_graph(), _pending(PENDING_CYCLES), _pending(PENDING_PRIVATE)
    cycles, reaches = import_cycles(graph), private_reaches()
    lines = [f"{len(cycles)} import circles in kvlab/ "
             f"({sum(' -> '.join(c) in pending_cycles for c in cycles)} pending on other branches)"]
    lines += [describe_cycle(graph, c) + (f"  [pending: {pending_cycles[k]}]" if (k := " -> ".join(c))
                                          in pending_cycles else "") for c in cycles]
    lines.append(f"{len(reaches)} private reaches across module boundaries "
                 f"({sum(f'{m}: {w}' in pending_private for m, _, w in reaches)} pending on other branches)")
    lines += [f"  {_where(m, line)} {w}" + (f"  [pending: {pending_private[k]}]" if (k := f"{m}: {w}")
                                            in pending_private else "") for m, line, w in reaches]
    breaches = memory_contract_breaches()
    lines.append(f"scheduler memory contract: {'kept by both memories' if not breaches else '; '.join(breaches)}")
    lines.append("the 10 longest functions (lines):")
    lines += [f"  {n:4d}  {where}" for n, where in longest_functions()]
    return "\n".join(lines)


if __name__ == "__main__":
    print(report())
