"""The caching-allocator package keeps the shape its docstring promises: imports go one way, modules stay small."""

import ast
import pathlib

import kvlab.device.caching_allocator as package

PACKAGE_DIR = pathlib.Path(package.__file__).parent
# A module may import, at run time, only modules of a lower layer (``if TYPE_CHECKING:`` imports are free).
LAYERS = {
    "sizes": 0, "blocks": 0, "oom": 0,
    "config": 1, "stats": 1,
    "expandable": 2, "snapshot_export": 2, "adopt": 2, "invariants": 2,
    "allocator": 3,
    "__init__": 4,
}


def _runtime_imports(tree: ast.Module):
    """Modules of the package imported outside ``if TYPE_CHECKING:`` blocks."""
    prefix = "kvlab.device.caching_allocator"

    def visit(nodes):
        for node in nodes:
            if isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING":
                yield from visit(node.orelse)
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith(prefix):
                if node.module == prefix:  # from kvlab.device.caching_allocator import adopt, ...
                    yield from (alias.name for alias in node.names)
                else:
                    yield node.module.removeprefix(prefix + ".")
            for child in ast.iter_child_nodes(node):
                if isinstance(child, ast.stmt):
                    yield from visit([child])

    yield from visit(tree.body)


def test_every_module_has_a_layer():
    assert {p.stem for p in PACKAGE_DIR.glob("*.py")} == set(LAYERS)


def test_imports_go_one_way():
    wrong = []
    for path in PACKAGE_DIR.glob("*.py"):
        for imported in _runtime_imports(ast.parse(path.read_text())):
            if LAYERS[imported] >= LAYERS[path.stem]:
                wrong.append(f"{path.stem} (layer {LAYERS[path.stem]}) imports {imported} (layer {LAYERS[imported]})")
    assert not wrong, wrong


def test_modules_stay_well_under_600_lines():
    sizes = {p.name: len(p.read_text().splitlines()) for p in PACKAGE_DIR.glob("*.py")}
    assert max(sizes.values()) < 500, sizes


def test_the_public_names_are_reexported():
    for name in package.__all__:
        assert getattr(package, name) is not None, name
    assert package.CachingAllocatorModel.snapshot.__module__.endswith(".snapshot_export")
