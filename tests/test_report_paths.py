"""The report's files carry no path of the machine that built it (issue 35 item 2): not the rendered page, not
the downloadable executed notebook (``notebooks/*.ipynb``), not a plotly figure's hover text (written in the
page's JSON with ``/`` as ``\\u002f``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvlab.paths import data_dir
from kvlab.report.pages import execute_one, strip_build_paths

REPO = Path(__file__).resolve().parents[1]


def test_strip_build_paths_also_takes_them_out_of_escaped_json():
    roots = {"/work/wt/x/": "", "/root/": "~/"}
    page = ('"hovertext":["weights (\\u002fwork\\u002fwt\\u002fx\\u002fdata\\u002flog)"] '
            '{"text": "\\\\u002fwork\\\\u002fwt\\\\u002fx\\\\u002fdata"} \\/root\\/.cache')
    assert strip_build_paths(page, roots) == ('"hovertext":["weights (data\\u002flog)"] '
                                              '{"text": "data"} ~\\/.cache')


@pytest.mark.slow
def test_a_reported_notebook_and_its_page_name_no_build_folder(tmp_path: Path):
    import nbformat

    log = Path(data_dir()).resolve() / "examples" / "server_logs"
    folder = tmp_path / "notebooks"
    folder.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(
        "import plotly.graph_objects as go\n"
        f"path = {str(log)!r}\n"
        "print(f'kvlab replay --log {path}/x.log')\n"
        "go.Figure(go.Bar(x=['weights'], y=[1], hovertext=[f'weights ({path}/x.log)'])).show()")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / "05_paths.ipynb")
    out = tmp_path / "site"
    (out / "notebooks").mkdir(parents=True)
    run = execute_one(folder / "05_paths.ipynb", out, "cpu", timeout=300)
    assert run.ok, run.error
    for written in (run.executed_path, run.html_path):
        text = written.read_text()
        assert "kvlab replay --log data/examples/server_logs/x.log" in text, written
        for root in {str(REPO), str(Path(data_dir()).resolve().parent)}:
            for form in (root, root.replace("/", "\\u002f"), root.replace("/", "\\\\u002f"), root.replace("/", "\\/")):
                assert form not in text, (written.name, form)
