"""Restart & Run All gives the same numbers: each notebook, run twice in fresh kernels, shows the same outputs.

Compared: every output's text (stream, text/plain, text/html tables, tracebacks), the plotly figure JSON and
the widget state (FigureWidget traces included), after normalising only what is not a result: wall-clock
durations, progress bars, Python object addresses, uuids and widget model ids (see nbvalues.py). Run 1 is the
one test_execute_all already made (conftest.first_run); this test adds the second.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .nbrun import NotebookExecutionError, execute_notebook, notebook_params
from .nbvalues import first_difference, notebook_values


@pytest.mark.slow
@pytest.mark.parametrize("notebook", notebook_params())
def test_restart_run_all_gives_the_same_numbers(notebook: Path, first_run, tmp_path: Path) -> None:
    run1 = first_run(notebook)
    if run1.error is not None:
        pytest.fail(f"run 1 failed, nothing to compare:\n{run1.error}\n(executed copy: {run1.saved_copy})",
                    pytrace=False)
    saved2 = tmp_path / notebook.name
    try:
        run2 = execute_notebook(notebook, timeout=600, output_path=saved2)
    except NotebookExecutionError as exc:
        pytest.fail(f"run 2 failed where run 1 did not:\n{exc}\n(executed copies: {run1.saved_copy}, {saved2})",
                    pytrace=False)
    values1 = notebook_values(run1.notebook)
    assert values1, f"{notebook.name} showed nothing to compare"
    diff = first_difference(values1, notebook_values(run2), run1.notebook)
    if diff is not None:
        pytest.fail(
            f"{notebook.name}: Restart & Run All showed different outputs in two fresh kernels; the first:\n{diff}\n"
            f"(executed copies: {run1.saved_copy}, {saved2})",
            pytrace=False,
        )
