"""Run a notebook headless with nbclient and read what its cells produced.

    nb = execute_notebook("notebooks/01_kv_pool_sizing.ipynb", env={"KVLAB_DEVICE": "cpu"})
    assert "budget ok" in find_output(nb, "budget")

Parameters follow papermill's convention: the injected cell (tag ``injected-parameters``) goes right after
the cell tagged ``parameters`` if there is one, otherwise first, so injected values override the defaults.
Environment variables are set in a cell of their own at the very top (tag ``injected-env``), before any
``import kvlab``. Nothing is written back to the source notebook.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
ALLOWED_ERROR_TAG = "raises-exception"  # nbclient's own tag for cells that are meant to fail


class NotebookExecutionError(RuntimeError):
    """A cell failed; the message holds the notebook path, the cell source and the traceback.

    ``notebook`` is the partly executed notebook (outputs up to and including the failing cell).
    """

    def __init__(self, message: str, notebook: nbformat.NotebookNode) -> None:
        super().__init__(message)
        self.notebook = notebook


def strip_ansi(text: str) -> str:
    return ANSI_ESCAPE.sub("", text)


def notebook_params() -> list:
    """``pytest.param(path, id=stem)`` for every notebooks/*.ipynb, for ``parametrize``."""
    import pytest

    notebooks = sorted(NOTEBOOK_DIR.glob("*.ipynb"))
    if not notebooks:
        # A skip, not zero tests: an empty parametrization would hide that nothing was checked.
        return [pytest.param(None, id="no-notebooks", marks=pytest.mark.skip(reason=f"no {NOTEBOOK_DIR}/*.ipynb yet"))]
    return [pytest.param(path, id=path.stem) for path in notebooks]


def _injected_cell(source: str, tag: str) -> nbformat.NotebookNode:
    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["tags"] = [tag]
    return cell


def inject_cells(
    nb: nbformat.NotebookNode, parameters: dict[str, Any] | None = None, env: dict[str, str] | None = None
) -> nbformat.NotebookNode:
    """Insert the env cell (first) and the parameters cell (after the ``parameters`` cell, else first)."""
    if parameters:
        lines = ["# Parameters injected by tests/notebooks/nbrun.py"]
        lines += [f"{name} = {value!r}" for name, value in parameters.items()]
        tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
        at = tagged[0] + 1 if tagged else 0
        nb.cells.insert(at, _injected_cell("\n".join(lines), "injected-parameters"))
    if env:
        lines = ["# Environment injected by tests/notebooks/nbrun.py", "import os"]
        lines += [f"os.environ[{name!r}] = {str(value)!r}" for name, value in env.items()]
        nb.cells.insert(0, _injected_cell("\n".join(lines), "injected-env"))
    return nb


def execute_notebook(
    path: str | os.PathLike[str],
    timeout: int = 600,
    parameters: dict[str, Any] | None = None,
    *,
    env: dict[str, str] | None = None,
    output_path: str | os.PathLike[str] | None = None,
    kernel_name: str = "python3",
) -> nbformat.NotebookNode:
    """Execute ``path`` with its own folder as the kernel's cwd and return the executed notebook.

    ``timeout`` is per cell (nbclient's meaning), in seconds. Widget state is kept in
    ``nb.metadata.widgets`` (store_widget_state=True). ``output_path`` saves the executed copy, also when
    a cell fails (useful as a test artifact; never point it at the source notebook).
    Raises NotebookExecutionError when a cell fails, times out or the kernel dies.
    """
    path = Path(path).resolve()
    nb = nbformat.read(path, as_version=4)
    inject_cells(nb, parameters, env)
    client = NotebookClient(
        nb,
        timeout=timeout,
        kernel_name=kernel_name,
        resources={"metadata": {"path": str(path.parent)}},
        store_widget_state=True,
    )
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        failing = _failing_cell_index(nb)
        where = f"cell {failing}" if failing is not None else "a cell"
        message = f"{path}: {where} failed ({type(exc).__name__})\n{strip_ansi(str(exc))}"
        raise NotebookExecutionError(message, nb) from exc
    finally:
        if output_path is not None:
            nbformat.write(nb, Path(output_path))
    return nb


def _failing_cell_index(nb: nbformat.NotebookNode) -> int | None:
    """Index of the first code cell with an error output (counting injected cells), if any."""
    for index, _, out in iter_outputs(nb):
        if out.get("output_type") == "error":
            return index
    return None


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
