"""``kvlab app``'s dashboard copy (title, cells tagged ``dashboard``, then the rest) and its Voila command line."""

from __future__ import annotations

import ast
import builtins
from pathlib import Path

import nbformat
import pytest

from kvlab.app import (
    DASHBOARD_TAG,
    MOVED_NOTE,
    PARAMETERS_TAG,
    SHARE_DIR,
    TEMPLATE,
    AppError,
    app_env,
    dashboard_folder,
    dashboard_notebook,
    find_notebook,
    voila_command,
    write_dashboard,
)
from kvlab.report import DEFAULT_NOTEBOOK_DIR, select_notebooks

v4 = nbformat.v4


def _notebook(*cells) -> nbformat.NotebookNode:
    nb = v4.new_notebook()
    nb.cells = list(cells)
    return nb


def _tagged(source: str) -> nbformat.NotebookNode:
    cell = v4.new_code_cell(source)
    cell.metadata["tags"] = [DASHBOARD_TAG]
    return cell


def test_the_title_then_the_tagged_cells_then_the_rest_with_a_note_where_they_were():
    intro = v4.new_markdown_cell("# 01 · A title\n\nThe introduction.\n")
    setup, panel, prose, later = (v4.new_code_cell("import os"), _tagged("panel = Panel()\npanel.widget"),
                                  v4.new_markdown_cell("## 2 · Try it"), v4.new_code_cell("print(1)"))
    nb = _notebook(intro, setup, prose, panel, later)

    out = dashboard_notebook(nb)

    assert [c.source for c in out.cells] == ["# 01 · A title", panel.source, "The introduction.", setup.source,
                                             prose.source, MOVED_NOTE, later.source]
    assert out.metadata["kvlab_app"] == {"title": "01 · A title", "dashboard_cells": 1}
    assert out.metadata["title"] == "01 · A title"
    assert len({c.id for c in out.cells}) == len(out.cells)  # cell ids stay unique
    nbformat.validate(out)
    assert [c.source for c in nb.cells][0].startswith("# 01 · A title\n")  # the original is not touched


def test_without_tagged_cells_the_order_is_the_notebooks_own():
    cells = [v4.new_markdown_cell("no heading here"), v4.new_code_cell("x = 1"), v4.new_code_cell("x")]
    out = dashboard_notebook(_notebook(*cells))
    assert [c.source for c in out.cells] == [c.source for c in cells]
    assert out.metadata["kvlab_app"] == {"title": None, "dashboard_cells": 0}
    only_title = dashboard_notebook(_notebook(v4.new_markdown_cell("# Just a title"), _tagged("panel")))
    assert [c.source for c in only_title.cells] == ["# Just a title", "panel", MOVED_NOTE]


def _bound_names(source: str) -> set[str]:
    """Names a cell imports, assigns or defines."""
    tree = ast.parse(source)
    bound = {a.asname or a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
             for a in n.names}
    bound |= {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del))}
    bound |= {n.name for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    return bound


def _free_names(source: str) -> set[str]:
    """Names a cell reads that it neither imports nor assigns (nor are builtins): what it needs from earlier."""
    tree = ast.parse(source)
    bound = _bound_names(source)
    read = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    return read - bound - set(dir(builtins)) - {"display", "get_ipython"}  # IPython puts these in the namespace


def test_free_names_are_what_a_cell_takes_from_earlier_cells():
    assert _free_names("from m import A\nimport os.path\nx = A(y, os.sep)\ndisplay(x)\nprint(len(x))") == {"y"}
    assert _free_names("panel = KVPoolPanel('p')\npanel.widget") == {"KVPoolPanel"}


@pytest.mark.parametrize("path", select_notebooks(DEFAULT_NOTEBOOK_DIR), ids=lambda p: p.stem)
def test_each_dashboard_cell_runs_on_its_own(path: Path):
    """A cell tagged ``dashboard`` runs before every other cell in ``kvlab app``: it must import what it uses."""
    nb = nbformat.read(path, as_version=4)
    # kvlab app runs the parameters cell first too (dashboard_notebook): the names it binds are available.
    given = set().union(*(_bound_names(c.source) for c in nb.cells if PARAMETERS_TAG in c.metadata.get("tags", [])))
    for index, cell in enumerate(nb.cells):
        if DASHBOARD_TAG in cell.metadata.get("tags", []):
            assert cell.cell_type == "code", f"{path.name} cell {index}: tagged {DASHBOARD_TAG} but {cell.cell_type}"
            free = _free_names(cell.source) - given
            assert not free, f"{path.name} cell {index} (tagged {DASHBOARD_TAG}) uses names of earlier cells: {free}"


def test_notebook_01_leads_with_its_panel():
    notebook = find_notebook("01")
    out = dashboard_notebook(nbformat.read(notebook, as_version=4))
    assert out.cells[0].source == "# 01 · Sizing the KV pool: measure after collecting"
    assert "parameters" in out.cells[1].metadata.get("tags", [])  # the settings the panel reads
    assert "KVPoolPanel(" in out.cells[2].source and out.cells[2].cell_type == "code"
    assert out.metadata["kvlab_app"]["dashboard_cells"] == 1


def test_the_copy_lives_in_a_temporary_folder_that_goes_away(tmp_path: Path):
    notebook = find_notebook("01")
    with dashboard_folder(notebook) as page:
        assert page.name == notebook.name and page.parent != notebook.parent and page.is_file()
        assert nbformat.read(page, as_version=4).metadata["kvlab_app"]["dashboard_cells"] == 1
    assert not page.parent.exists()
    broken = tmp_path / "99_broken.ipynb"
    broken.write_text("{not json")
    with pytest.raises(AppError, match="99_broken.ipynb"):
        write_dashboard(broken, tmp_path)


def test_voila_serves_the_copy_progressively_with_kernels_in_the_notebooks_folder(tmp_path: Path):
    notebook = find_notebook("01")
    page = write_dashboard(notebook, tmp_path)
    cmd = voila_command(notebook, page=page, port=8899)
    assert cmd[1:5] == ["-m", "kvlab.app_server", str(page.parent), str(page)]  # its folder goes when Voila does
    for option in (f"--Voila.root_dir={tmp_path}", f"--MappingKernelManager.root_dir={notebook.parent}",
                   "--VoilaConfiguration.progressive_rendering=True", f"--VoilaConfiguration.template={TEMPLATE}",
                   "--strip_sources=True", "--Voila.ip=127.0.0.1", "--no-browser", "--show_tracebacks=False",
                   "--VoilaConfiguration.multi_kernel_manager_class=kvlab.app_server.CappedKernelManager",
                   "--CappedKernelManager.max_kernels=8"):
        assert option in cmd, option
    assert not any("token" in arg for arg in cmd)  # a token travels in the environment (app_env), never here
    assert "--show_tracebacks=True" in voila_command(notebook, page=page, port=8899, show_tracebacks=True)


def test_voila_finds_the_kvlab_template_through_app_env(monkeypatch: pytest.MonkeyPatch):
    from voila.paths import collect_template_paths

    monkeypatch.setenv("JUPYTER_PATH", app_env(None)["JUPYTER_PATH"])
    paths = collect_template_paths(["voila", "nbconvert"], TEMPLATE, prune=True)
    assert paths[0] == str(SHARE_DIR / "voila" / "templates" / TEMPLATE)
    assert any(p.endswith("voila/templates/lab") for p in paths)  # it extends Voila's lab template


def test_the_parameters_cell_runs_before_the_panel():
    """Notebook 01's panel reads PRESET from its parameters cell: the app puts that cell first, once."""
    nb = nbformat.read(DEFAULT_NOTEBOOK_DIR / "01_kv_pool_sizing.ipynb", as_version=4)
    out = dashboard_notebook(nb)
    tags = [c.metadata.get("tags", []) for c in out.cells]
    first_params = next(i for i, t in enumerate(tags) if PARAMETERS_TAG in t)
    first_panel = next(i for i, t in enumerate(tags) if DASHBOARD_TAG in t)
    assert first_params < first_panel
    assert sum(PARAMETERS_TAG in t for t in tags) == 1
