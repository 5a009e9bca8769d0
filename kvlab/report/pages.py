"""Executing one notebook headless and rendering it into one offline page of the report."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from pathlib import Path

from kvlab.paths import notebook_dir

DEFAULT_NOTEBOOK_DIR = notebook_dir()  # the checkout's notebooks/, a wheel's copy or KVLAB_NOTEBOOK_DIR


@dataclass
class NotebookRun:
    """What happened to one notebook."""

    name: str  # file stem, e.g. "01_kv_pool_sizing"
    source: Path
    ok: bool = False
    seconds: float = 0.0
    error: str | None = None  # "notebooks/01_x.ipynb: cell 7 failed (CellExecutionError): ..." when not ok
    failed_cell: int | None = None  # index in the *source* notebook (the injected env cell not counted)
    html_path: Path | None = None
    executed_path: Path | None = None


def kernel_env(device: str) -> dict[str, str]:
    # KVLAB_STATIC: the page is read without a kernel, so panels word their hints for it (kvlab.viz.wording)
    return {"KVLAB_DEVICE": device, "KVLAB_PROGRESS": "0", "PLOTLY_RENDERER": "plotly_mimetype+notebook",
            "KVLAB_STATIC": "1"}


def share_plotly_js(page: str, plotly_js: str, src: str = "plotly.min.js") -> str:
    """``page`` with each ``<script>`` that inlines ``plotly_js`` (plotly.min.js's text) replaced by a tag loading
    the report's one shared copy (``src``, relative to the page): 4.8 MB less per page, and the page still loads
    nothing off the machine. A classic ``<script src>`` runs in document order, as the inline one did."""
    out, start = [], 0
    while (at := page.find(plotly_js, start)) >= 0:
        open_at = page.rfind("<script", start, at)
        close_at = page.find("</script>", at + len(plotly_js))
        if open_at < 0 or close_at < 0 or page[open_at:at].count(">") != 1:  # not the whole body of one tag
            out.append(page[start:at + len(plotly_js)])
            start = at + len(plotly_js)
            continue
        out.append(page[start:open_at] + f'<script type="text/javascript" charset="utf-8" src="{src}"></script>')
        start = close_at + len("</script>")
    return "".join(out) + page[start:]


def build_paths() -> dict[str, str]:
    """Folders of the machine that built the report, longest first, and what a page shows instead: the checkout
    (or installed package) root as nothing (paths read ``data/examples/…``), the home folder as ``~``."""
    from kvlab.paths import data_dir

    roots = {str(Path(data_dir()).resolve().parent) + os.sep: "", str(DEFAULT_NOTEBOOK_DIR.resolve().parent) + os.sep:
             "", str(Path.home()) + os.sep: "~" + os.sep}
    return dict(sorted(((k, v) for k, v in roots.items() if len(k) > 1), key=lambda kv: -len(kv[0])))


def strip_build_paths(page: str, roots: dict[str, str]) -> str:
    """``page`` with the build machine's folders (``roots``: prefix -> shown instead) taken out of every path,
    also where a JSON inside the page writes ``/`` as ``\\u002f`` (plotly's figures: notebook 05's hover text)
    or ``\\/``, or where that JSON is itself a string in a notebook file (``\\\\u002f``)."""
    for prefix, shown in roots.items():
        for slash in ("/", "\\u002f", "\\\\u002f", "\\/"):
            page = page.replace(prefix.replace("/", slash), shown.replace("/", slash))
    return page


def strip_build_paths_in_file(path: Path, roots: dict[str, str]) -> None:
    """:func:`strip_build_paths` on a written file (the executed notebook: its outputs print the data's paths)."""
    if path.is_file():
        text = path.read_text(encoding="utf-8")
        stripped = strip_build_paths(text, roots)
        if stripped != text:
            path.write_text(stripped, encoding="utf-8")


def execute_one(source: Path, out_dir: Path, device: str, *, timeout: int = 900,
                plotly_js: str | None = None) -> NotebookRun:
    """Execute ``source`` into ``out_dir/notebooks`` and render it into ``out_dir/html``; never raises for a
    failing cell (the run records it, the partial notebook is still written and rendered). With ``plotly_js``
    (plotly.min.js's text) the page loads the report's shared copy instead of inlining it."""
    from kvlab.notebook_exec import NotebookExecutionError, execute_notebook

    run = NotebookRun(name=source.stem, source=source)
    start = time.perf_counter()
    run.executed_path = out_dir / "notebooks" / source.name
    try:
        nb = execute_notebook(source, timeout, env=kernel_env(device), output_path=run.executed_path)
        run.ok = True
    except NotebookExecutionError as exc:
        nb, run.failed_cell = exc.notebook, exc.cell
        run.error = f"{exc.headline}: {exc.last_line}"
    run.seconds = time.perf_counter() - start
    nb.metadata["kvlab_source"] = source.name  # (the rendered copy only: the executed one is already written)
    run.html_path = out_dir / "html" / f"{source.stem}.html"
    run.html_path.parent.mkdir(parents=True, exist_ok=True)
    page = render_html(nb)
    if plotly_js:
        page = share_plotly_js(page, plotly_js)
    roots = build_paths() | {str(source.parent.resolve().parent) + os.sep: ""}
    run.html_path.write_text(strip_build_paths(page, roots), encoding="utf-8")
    strip_build_paths_in_file(run.executed_path, roots)  # the downloadable .ipynb too
    return run


def render_html(nb) -> str:
    """One offline page (nbconvert's lab template without its CDN scripts, math by inlined KaTeX: see
    ``kvlab.viz.offline``) over a copy whose widget outputs are replaced by static HTML from the saved widget
    state (figures as plotly divs, plotly.js inlined once): FigureWidgets need a kernel or a CDN, the page
    must work offline. ``fig.show()`` outputs carry their own plotly.js (PLOTLY_RENDERER)."""
    from kvlab.viz.export import static_widget_outputs  # lazy: the core never imports plotly
    from kvlab.viz.offline import render_notebook_html

    return render_notebook_html(static_widget_outputs(mark_static_panels(nb)))


WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
STATIC_PANEL_NOTE = ("<div class='kvlab-static-note' style='padding:4px 10px;margin:2px 0;color:#555;"
                     "background:#f4f4f4;border-left:3px solid #bbb'>Static copy of a live panel: it shows the "
                     "settings the report ran with, and its controls do nothing here. Run the notebook in "
                     "JupyterLab, Voila or <code>kvlab app {number}</code> to change them.</div>")


def mark_static_panels(nb):
    """A copy of ``nb`` with a note above each live panel (an output drawn by widgets): in a static page its
    buttons and sliders cannot answer, so the page says so rather than ask the reader to press them."""
    import copy

    import nbformat

    nb = copy.deepcopy(nb)
    stem = Path(nb.metadata.get("kvlab_source", "")).stem
    number = stem.split("_", 1)[0] if stem[:2].isdigit() else "NN"
    for cell in nb.cells:
        outputs = cell.get("outputs", []) if cell.cell_type == "code" else []
        if any(WIDGET_VIEW in o.get("data", {}) for o in outputs):
            note = nbformat.v4.new_output("display_data", data={"text/html": STATIC_PANEL_NOTE.format(number=number),
                                                                "text/plain": "static copy of a live panel"})
            cell["outputs"] = [note, *outputs]
    return nb
