"""Each notebook's first headless run, executed once per session and shared by the tests that need it.

test_execute_all checks that run for errors; test_restart_run_all runs the notebook a second time in a fresh
kernel and compares the two, so the whole suite executes each notebook twice, not three times.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import nbformat
import pytest

from .nbrun import NotebookExecutionError, execute_notebook


@dataclass(frozen=True)
class Executed:
    """One headless run: the executed notebook (partial if a cell failed), its saved copy, and the failure."""

    notebook: nbformat.NotebookNode
    saved_copy: Path
    error: NotebookExecutionError | None


@pytest.fixture(scope="session")
def first_run(tmp_path_factory: pytest.TempPathFactory) -> Callable[[Path], Executed]:
    """``first_run(path)``: the notebook executed headless (kernel cwd = its folder), once per session."""
    runs: dict[Path, Executed] = {}

    def run(notebook: Path) -> Executed:
        if notebook not in runs:
            saved = tmp_path_factory.mktemp(f"{notebook.stem}-run1") / notebook.name
            try:
                runs[notebook] = Executed(execute_notebook(notebook, timeout=600, output_path=saved), saved, None)
            except NotebookExecutionError as exc:
                runs[notebook] = Executed(exc.notebook, saved, exc)
        return runs[notebook]

    return run
