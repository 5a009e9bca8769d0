"""Every notebook in notebooks/ runs headless, top to bottom, without an error output."""

from __future__ import annotations

from pathlib import Path

import pytest

from .nbrun import NotebookExecutionError, error_outputs, execute_notebook

NOTEBOOK_DIR = Path(__file__).resolve().parents[2] / "notebooks"
NOTEBOOKS = sorted(NOTEBOOK_DIR.glob("*.ipynb"))


def _params() -> list:
    if not NOTEBOOKS:
        # A skip, not zero tests: an empty parametrization would hide that nothing was checked.
        return [pytest.param(None, id="no-notebooks", marks=pytest.mark.skip(reason=f"no {NOTEBOOK_DIR}/*.ipynb yet"))]
    return [pytest.param(path, id=path.stem) for path in NOTEBOOKS]


@pytest.mark.slow
@pytest.mark.parametrize("notebook", _params())
def test_notebook_executes(notebook: Path, tmp_path: Path) -> None:
    """Execute the notebook (kernel cwd = notebooks/); the executed copy is kept in tmp_path."""
    executed = tmp_path / notebook.name
    try:
        nb = execute_notebook(notebook, timeout=600, output_path=executed)
    except NotebookExecutionError as exc:
        pytest.fail(f"{exc}\n(executed copy: {executed})", pytrace=False)
    errors = error_outputs(nb)
    assert not errors, "\n\n".join(errors)
