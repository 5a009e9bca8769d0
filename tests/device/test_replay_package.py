"""The replay package's one-way flow (docs/architecture.md#contracts-inside-the-packages): settings and seed,
then report, engine, fidelity, what-ifs on top; no module imports a ``_private`` name from another, and no
import cycle runs through the replay or the snapshot reader, counting imports inside functions and under
TYPE_CHECKING."""

from __future__ import annotations

import ast
import pathlib

ROOT = pathlib.Path(__file__).resolve().parents[2]
DEVICE = ROOT / "kvlab" / "device"
PACKAGE = DEVICE / "replay"
FLOW = ("settings", "seed", "report", "engine", "fidelity", "whatif")  # each imports only those before it


def _module_name(path: pathlib.Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: pathlib.Path):
    """(imported module, names) for every import in ``path``, wherever it sits."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.ImportFrom) and node.module:
            yield node.module, [alias.name for alias in node.names]
        elif isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, []


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in DEVICE.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for module, names in _imports(path):
            for target in [module, *(f"{module}.{n}" for n in names)]:
                if target in modules and target != name:
                    edges.add(target)
        graph[name] = edges
    return graph


def test_no_import_cycle_through_the_replay_or_the_snapshot_reader():
    graph = _graph()
    state: dict[str, int] = {}
    cycles = []

    def visit(node: str, stack: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(graph[node]):
            if state.get(nxt) == 1:
                cycles.append(" -> ".join(stack[stack.index(nxt):] + [node, nxt]) if nxt in stack else f"{node} -> {nxt}")
            elif nxt not in state:
                visit(nxt, [*stack, node])
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node, [])
    mine = [c for c in cycles if "kvlab.device.replay" in c or "kvlab.device.snapshot" in c]  # other packages: theirs
    assert not mine, mine


def test_the_replay_modules_import_one_way_and_only_public_names():
    offenders = []
    for path in sorted(PACKAGE.glob("*.py")):
        me = path.stem
        for module, names in _imports(path):
            if not module.startswith("kvlab.device.replay."):
                continue
            other = module.rsplit(".", 1)[1]
            if me in FLOW and (other not in FLOW or FLOW.index(other) >= FLOW.index(me)):
                offenders.append(f"{me} imports {other} (the flow is {' -> '.join(FLOW)})")
            offenders += [f"{me} imports {other}.{n}" for n in names if n.startswith("_")]
    assert (PACKAGE / "__init__.py").exists() and not list(_imports(PACKAGE / "__init__.py"))
    assert not offenders, offenders
