"""kvlab.notebook_exec, the one executor of `kvlab report` and the notebook tests: injected cells, the kernel's
folder, the failing cell named in the source notebook's numbering, the executed copy kept on failure."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest

from kvlab.notebook_exec import ENV_TAG, PARAMETERS_TAG, NotebookExecutionError, execute_notebook, inject_cells


def _notebook(path: Path, *cells: tuple[str, list[str]]) -> Path:
    """Write a notebook of (source, tags) code cells."""
    nb = nbformat.v4.new_notebook()
    for source, tags in cells:
        cell = nbformat.v4.new_code_cell(source)
        if tags:
            cell.metadata["tags"] = tags
        nb.cells.append(cell)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    return path


def test_injected_cells_go_first_and_after_the_parameters_cell():
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import os"), nbformat.v4.new_code_cell("n = 1")]
    nb.cells[1].metadata["tags"] = ["parameters"]
    inject_cells(nb, parameters={"n": 3, "name": "x"}, env={"KVLAB_DEVICE": "sim:h200"})
    tags = [c.metadata.get("tags", []) for c in nb.cells]
    assert tags == [[ENV_TAG], [], ["parameters"], [PARAMETERS_TAG]]
    assert "os.environ['KVLAB_DEVICE'] = 'sim:h200'" in nb.cells[0].source
    assert "n = 3\nname = 'x'" in nb.cells[3].source


@pytest.mark.slow
def test_runs_in_the_notebooks_folder_with_env_and_parameters(tmp_path: Path):
    folder = tmp_path / "nbs"
    folder.mkdir()
    (folder / "beside.txt").write_text("found")
    path = _notebook(folder / "a.ipynb", ("n = 1", ["parameters"]),
                     ("import os\nprint(open('beside.txt').read(), os.environ['KVLAB_X'], n)", []))
    before = path.read_bytes()
    nb = execute_notebook(path, timeout=120, parameters={"n": 7}, env={"KVLAB_X": "set"})
    assert nb.cells[-1].outputs[0]["text"] == "found set 7\n"
    assert path.read_bytes() == before  # the source notebook is untouched


@pytest.mark.slow
def test_a_failing_cell_is_named_in_the_source_notebooks_numbering(tmp_path: Path):
    path = _notebook(tmp_path / "bad.ipynb", ("n = 1", ["parameters"]), ("x = n", []),
                     ("raise ValueError('broken on purpose')", []), ("print('never')", []))
    saved = tmp_path / "out" / "bad.ipynb"
    with pytest.raises(NotebookExecutionError) as caught:
        execute_notebook(path, timeout=120, parameters={"n": 2}, env={"KVLAB_X": "1"}, output_path=saved)
    exc = caught.value
    assert exc.cell == 2 and exc.headline == "bad.ipynb: cell 2 failed (CellExecutionError)"
    assert exc.last_line == "ValueError: broken on purpose" and str(path) in str(exc)
    kept = nbformat.read(saved, as_version=4)  # the partial copy, injected cells included, is written anyway
    assert kept.cells[4].outputs[0]["output_type"] == "error" and not kept.cells[5].get("outputs")


def test_the_kernel_prints_no_transport_warning(tmp_path: Path, capfd):
    """`kvlab report` runs one kernel per notebook: ipykernel's "running over TCP without encryption" warning
    (written to the terminal by the kernel process, so read at the file-descriptor level) is not shown, because the
    kernel's sockets are encrypted with manager-provisioned CurveZMQ keys."""
    path = _notebook(tmp_path / "t.ipynb", ("print(6 * 7)", []))
    nb = execute_notebook(path, timeout=120)
    assert nb.cells[-1].outputs[0]["text"] == "42\n"
    captured = capfd.readouterr()
    assert "without encryption" not in captured.err + captured.out, captured.err
