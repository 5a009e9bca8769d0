"""Run a notebook headless and read what its cells produced.

    nb = execute_notebook("notebooks/01_kv_pool_sizing.ipynb", env={"KVLAB_DEVICE": "cpu"})
    assert "budget ok" in find_output(nb, "budget")

Executing is kvlab's own :mod:`kvlab.notebook_exec` (the executor ``kvlab report`` uses, with its injected-env and
injected-parameters cells, per-cell timeout and kernel name); this module adds what only tests need: the
notebooks to parametrize over and helpers that read outputs.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import nbformat

from kvlab.notebook_exec import NotebookExecutionError, execute_notebook, strip_ansi

__all__ = ["NotebookExecutionError", "cell_outputs_text", "error_outputs", "execute_notebook", "find_output",
           "iter_outputs", "notebook_params", "output_text", "strip_ansi"]

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"  # this checkout's, whatever KVLAB_NOTEBOOK_DIR says
ALLOWED_ERROR_TAG = "raises-exception"  # nbclient's own tag for cells that are meant to fail


def notebook_params() -> list:
    """``pytest.param(path, id=stem)`` for every notebooks/*.ipynb, for ``parametrize``."""
    import pytest

    notebooks = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
    if not notebooks:
        # A skip, not zero tests: an empty parametrization would hide that nothing was checked.
        return [pytest.param(None, id="no-notebooks", marks=pytest.mark.skip(reason=f"no {NOTEBOOK_DIR}/*.ipynb yet"))]
    return [pytest.param(path, id=path.stem) for path in notebooks]


def iter_outputs(nb: nbformat.NotebookNode) -> Iterator[tuple[int, nbformat.NotebookNode, dict]]:
    """Yield (cell index, cell, output) for every output of every code cell."""
    for index, cell in enumerate(nb.cells):
        if cell.cell_type == "code":
            for out in cell.get("outputs", []):
                yield index, cell, out


def output_text(out: dict) -> str:
    """The human-readable text of one output: stream text, text/plain, text/html or an error traceback."""
    kind = out.get("output_type")
    if kind == "stream":
        return out.get("text", "")
    if kind == "error":
        return strip_ansi("\n".join(out.get("traceback", [])) or f"{out.get('ename')}: {out.get('evalue')}")
    data = out.get("data", {})
    parts = [data[mime] for mime in ("text/plain", "text/html", "text/markdown") if mime in data]
    return "\n".join("".join(p) if isinstance(p, list) else str(p) for p in parts)


def cell_outputs_text(nb: nbformat.NotebookNode) -> list[str]:
    """One string per code cell (all its outputs joined), in cell order; '' for a cell without output."""
    return [
        "\n".join(output_text(out) for out in cell.get("outputs", []))
        for cell in nb.cells
        if cell.cell_type == "code"
    ]


def find_output(nb: nbformat.NotebookNode, marker: str) -> str:
    """The text of the first output that contains ``marker``; AssertionError listing what was there if none."""
    for _, _, out in iter_outputs(nb):
        text = output_text(out)
        if marker in text:
            return text
    seen = "\n---\n".join(t[:300] for t in cell_outputs_text(nb) if t)
    raise AssertionError(f"no output contains {marker!r}; outputs were:\n{seen}")


def error_outputs(nb: nbformat.NotebookNode) -> list[str]:
    """Tracebacks of error outputs, except in cells tagged ``raises-exception``."""
    return [
        f"cell {index}:\n{cell.source}\n{output_text(out)}"
        for index, cell, out in iter_outputs(nb)
        if out.get("output_type") == "error" and ALLOWED_ERROR_TAG not in cell.get("metadata", {}).get("tags", [])
    ]
