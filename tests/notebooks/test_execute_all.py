"""Every notebook in notebooks/ runs headless, top to bottom, without an error output."""

from __future__ import annotations

from pathlib import Path

import pytest

from .nbrun import error_outputs, notebook_params


@pytest.mark.slow
@pytest.mark.parametrize("notebook", notebook_params())
def test_notebook_executes(notebook: Path, first_run) -> None:
    """Execute the notebook (kernel cwd = notebooks/); the executed copy is kept in the session's tmp dir."""
    run = first_run(notebook)
    if run.error is not None:
        pytest.fail(f"{run.error}\n(executed copy: {run.saved_copy})", pytrace=False)
    errors = error_outputs(run.notebook)
    assert not errors, "\n\n".join(errors)
