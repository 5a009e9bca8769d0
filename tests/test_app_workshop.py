"""``kvlab app --workshop N --solutions`` (issue 25 item 7): pre-heated kernels and solutions on the page.

The command line and the environment are checked directly; then the real CLI serves a two-cell notebook with one
pre-heated kernel: the first page arrives with the notebook already run (its outputs in the HTML, no execution
websocket needed), a replacement kernel is started, a pooled kernel outlives the idle culler, and an exercise's
solution is offered folded on the page.
"""

from __future__ import annotations

import re
import signal
import time
import urllib.request
from pathlib import Path

import pytest

from kvlab.app import APP_ENV, APP_NOTEBOOK_ENV, AppError, app_env, find_notebook, voila_command, write_dashboard
from kvlab.cli import build_parser
from kvlab.labs.check import CheckLine, CheckResult
from kvlab.labs.solution import Solution, set_solutions
from tests.test_app_lifecycle import _kernels, _wait_for, start_app  # noqa: F401  (the fixture)


def test_workshop_mode_preheats_instead_of_rendering_progressively(tmp_path: Path):
    notebook = find_notebook("01")
    page = write_dashboard(notebook, tmp_path)
    cmd = voila_command(notebook, page=page, port=8899, pool_size=3, max_kernels=8)
    for option in ("--VoilaConfiguration.preheat_kernel=True", "--VoilaConfiguration.default_pool_size=3",
                   "--VoilaConfiguration.progressive_rendering=False",
                   "--CappedKernelManager.max_kernels=11"):  # 8 pages, the 3 waiting kernels on top
        assert option in cmd, option
    assert "--VoilaConfiguration.progressive_rendering=True" not in cmd
    plain = voila_command(notebook, page=page, port=8899)
    assert "--VoilaConfiguration.progressive_rendering=True" in plain and not any("preheat_kernel" in a for a in plain)
    assert "--CappedKernelManager.max_kernels=0" in voila_command(notebook, page=page, port=8899, pool_size=2,
                                                                  max_kernels=0)  # no cap stays no cap
    with pytest.raises(AppError, match="--workshop: must be >= 0"):
        voila_command(notebook, page=page, port=8899, pool_size=-1)


def test_the_cli_flags_reach_serve():
    args = build_parser().parse_args(["app", "02", "--workshop", "4", "--solutions"])
    assert args.workshop == 4 and args.solutions
    args = build_parser().parse_args(["app", "02"])
    assert args.workshop == 0 and not args.solutions


def test_app_env_marks_the_app_and_solutions(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("KVLAB_SOLUTIONS", raising=False)
    assert app_env(None, notebook=find_notebook("02"))[APP_NOTEBOOK_ENV] == "02"
    assert app_env(None)[APP_ENV] == "1" and "KVLAB_SOLUTIONS" not in app_env(None)
    assert app_env(None, solutions=True)["KVLAB_SOLUTIONS"] == "1"


def test_on_an_app_page_a_solution_is_folded_and_a_failed_check_says_where_the_code_is(monkeypatch):
    solution = Solution("collect first", "def f():\n    return 1\n")
    wrong = CheckResult("measure", (CheckLine("pool", False, 1, 2),))
    monkeypatch.delenv(APP_ENV, raising=False)
    set_solutions(None)
    monkeypatch.delenv("KVLAB_SOLUTIONS", raising=False)
    assert "KVLAB_SOLUTIONS=1" in solution._repr_html_() and "hidden on this page" not in wrong.text()
    monkeypatch.setenv(APP_ENV, "1")
    monkeypatch.setenv(APP_NOTEBOOK_ENV, "02")  # kvlab app 02 sets it (app_env): the real number, not "NN"
    assert "kvlab app 02 --solutions" in solution._repr_html_() and "NN" not in solution._repr_html_()
    assert "hidden on this page" in wrong.text() and "kvlab app 02 --solutions" in wrong._repr_html_()
    monkeypatch.setenv("KVLAB_SOLUTIONS", "1")
    html = solution._repr_html_()
    assert html.startswith("<details class='kvlab-solution'>") and "Show the solution" in html  # folded
    assert "return 1" in html and "Open the solution below" in wrong.text()
    assert "hidden" not in wrong.text() and "hidden" not in wrong._repr_html_()  # --solutions: it is not hidden
    assert "hidden on this page" not in CheckResult("ok", (CheckLine("pool", True, 2, 2),)).text()


def _notebook(folder: Path) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("import os\nprint('kvlab-workshop-ready', os.environ.get('KVLAB_APP'))"),
                nbformat.v4.new_code_cell("from kvlab.labs.solution import Solution\n"
                                          "Solution('the reference', 'answer = 42')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / "01_workshop.ipynb")


@pytest.mark.slow
def test_a_preheated_page_arrives_run_and_the_pool_refills_and_is_not_culled(start_app, tmp_path: Path):  # noqa: F811
    folder = tmp_path / "nbs"
    folder.mkdir()
    _notebook(folder)
    app = start_app("--workshop", "1", "--solutions", "--cull-idle-seconds", "2", notebook="01", notebook_dir=folder)
    _wait_for(lambda: "is filled with 1 kernel" in app.log.read_text(), 180, "the pool filled", app.log)
    (pooled,) = _kernels(app.process.pid)
    time.sleep(5)  # past the culler's idle timeout (2 s, checked every second): a pooled kernel must stay
    assert [k.pid for k in _kernels(app.process.pid)] == [pooled.pid]
    started = time.monotonic()
    with urllib.request.urlopen(app.url, timeout=120) as response:
        page = response.read().decode()
    took = time.monotonic() - started
    assert "kvlab-workshop-ready 1" in page  # run before the page was asked for: outputs in the HTML
    assert "Show the solution" in page and "answer = 42" in page  # --solutions, folded on an app page
    assert re.search(r'"kernelId": ?"[0-9a-f-]+"', page)
    assert took < 30, took  # no notebook run on the request's path (it took well under a second idle)
    # a replacement is pre-heated; this page never connects, so its kernel is culled as an abandoned page's is,
    # while the replacement, waiting in the pool, stays
    _wait_for(lambda: app.log.read_text().count("is filled with 1 kernel") == 2, 180, "a replacement", app.log)
    _wait_for(lambda: pooled.pid not in {k.pid for k in _kernels(app.process.pid)}, 60, "the page culled", app.log)
    (replacement,) = _kernels(app.process.pid)
    time.sleep(5)
    assert [k.pid for k in _kernels(app.process.pid)] == [replacement.pid]
    assert "stopped (SIGTERM)" in app.stop(signal.SIGTERM)


def test_the_text_above_each_solution_does_not_say_it_is_hidden():
    """With ``--solutions`` the solution is on the page right under this markdown: it must not say "hidden"
    (whether it is shown is said by the solution's own output), and it names the notebook's real number."""
    import nbformat

    found = 0
    for path in sorted(Path(find_notebook("01").parent).glob("[0-9][0-9]_*.ipynb")):
        cells = nbformat.read(path, as_version=4).cells
        for above, cell in zip(cells, cells[1:]):
            if cell.cell_type == "code" and re.fullmatch(r"lab\.\w+\.solution", cell.source.strip()):
                if above.cell_type != "markdown":
                    continue
                found += 1
                assert "hidden" not in above.source.lower(), (path.name, above.source)
                assert f"kvlab app {path.name[:2]} --solutions" in above.source, (path.name, above.source)
    assert found >= 3
