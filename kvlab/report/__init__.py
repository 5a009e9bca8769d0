"""``kvlab report``: execute every notebook headless and write a static, offline site of the results.

    DIR/index.html                  the headline numbers as tables in words, links to each notebook's page
                                    (failed ones marked), the key figures with captions
    DIR/notebooks/NN_name.ipynb     the executed copies (partly executed when a cell failed)
    DIR/html/NN_name.html           each notebook rendered by nbconvert, (with math) KaTeX inlined, plotly.js
                                    from the report's one copy beside it: the page requests nothing off the
                                    machine (kvlab.viz.offline); build-machine folders are taken out of paths
    DIR/html/plotly.min.js          plotly.js, once for every page (each page would otherwise inline 4.8 MB)
    DIR/figures/*.png               the findings' key figures as static images (kaleido, 1200 px at scale 2)
    DIR/summary.json                headline numbers of both findings, both arms, computed by calling
                                    kvlab.experiments directly with the notebooks' settings (never scraped
                                    from notebook outputs), the devices named
    DIR/.kvlab-report               the manifest: every file this report wrote, with its SHA-256

Every notebook is read first (``kvlab.notebook_exec.read_notebook``: a FIFO, a device, a notebook without cells or
nested too deep is refused by name before anything is written). Notebooks run through ``kvlab.notebook_exec``
(the test suite's executor too): in their own folder as cwd (as in JupyterLab) with ``KVLAB_DEVICE`` set in an
injected first cell (tag ``injected-env``), so ``--device`` reaches ``kvlab.device.resolve_device_name`` inside the
kernel. ``PLOTLY_RENDERER=plotly_mimetype+notebook`` makes
``fig.show()`` leave an HTML output (with plotly.js) that nbconvert can render; live FigureWidgets need a
kernel and show in the page as their static fallback only. ``KVLAB_STATIC=1`` tells panels the page is static
(``kvlab.viz.wording``): no hint asks a reader to move a control. One line per notebook goes to stderr as it
finishes (``[3/8] 02_shortfall_eviction … 31 s``; ``KVLAB_PROGRESS=0`` silences them). SIGINT, SIGTERM or
SIGHUP stops the report (the kernel killed, the partial copy kept): :class:`ReportStopped` says what was written,
and every file written so far is in the manifest, so the next report clears it.

What is deleted and overwritten: only files the manifest proves a report wrote (same path, same SHA-256 now),
reached inside ``DIR`` without a link, and then the report's folders it made itself if they are left empty; never
a file someone changed or put there since, never a folder the report did not make. A manifest that names a path
a report never writes (absolute, ``..``, deeper than ``DIR/notebooks/x``) is refused before anything is deleted,
and so is a report folder that is a link (the report would write through it). A directory that holds no manifest
and is not empty needs ``--force``, which lets the report write *beside* the files there, never over one: a file
the report would write that exists and is not proven kvlab's stops the report before anything runs, naming it.
``--force`` marks nothing as kvlab's but the files it then writes. The notebooks' own folder
(``--notebook-dir``) is never one the report writes into (``DIR``, ``DIR/notebooks``, ``DIR/html``,
``DIR/figures``).
"""

from __future__ import annotations

import html
import json
import os
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.report.manifest import MARKER as MARKER
from kvlab.report.manifest import OUTPUT_FOLDERS as OUTPUT_FOLDERS
from kvlab.report.manifest import PLOTLY_JS_FILE as PLOTLY_JS_FILE
from kvlab.report.manifest import Manifest as Manifest
from kvlab.report.manifest import ReportError as ReportError
from kvlab.report.manifest import check_out_dir as check_out_dir
from kvlab.report.manifest import planned_files as planned_files
from kvlab.report.manifest import prepare_out_dir as prepare_out_dir
from kvlab.report.pages import DEFAULT_NOTEBOOK_DIR as DEFAULT_NOTEBOOK_DIR
from kvlab.report.pages import NotebookRun as NotebookRun
from kvlab.report.pages import execute_one as execute_one
from kvlab.report.pages import kernel_env as kernel_env
from kvlab.report.pages import render_html as render_html
from kvlab.report.pages import share_plotly_js as share_plotly_js
from kvlab.report.pages import strip_build_paths as strip_build_paths
from kvlab.report.summary import SUMMARY_GPU_PRESET as SUMMARY_GPU_PRESET
from kvlab.report.summary import SUMMARY_PRESET as SUMMARY_PRESET
from kvlab.report.summary import Headline as Headline
from kvlab.report.summary import compute_summary as compute_summary
from kvlab.report.summary import describe_device as describe_device
from kvlab.report.summary import headline_html
from kvlab.report.summary import headlines as headlines
from kvlab.safe_text import printable
from kvlab.stop_signals import Stopped, stop_on_signals


class ReportStopped(Stopped):
    """A signal stopped the report; ``message`` says what was written (every file of it is in the manifest)."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(signum)
        self.message = message


@dataclass
class Report:
    out_dir: Path
    device: str
    runs: list[NotebookRun] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    pngs: list[Path] = field(default_factory=list)
    figure_error: str | None = None  # the PNG export's error, when kaleido failed (the rest is still written)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.runs) and self.figure_error is None

    @property
    def failures(self) -> list[NotebookRun]:
        return [r for r in self.runs if not r.ok]


# ---- choosing notebooks -------------------------------------------------------------------------------
def select_notebooks(notebook_dir: Path = DEFAULT_NOTEBOOK_DIR, only: Sequence[str] | None = None) -> list[Path]:
    """``notebooks/*.ipynb`` sorted; ``only`` keeps those whose number prefix (``01``) or stem matches."""
    found = sorted(Path(notebook_dir).glob("*.ipynb"))
    if not found:
        raise ReportError(f"no notebooks found in {notebook_dir}")
    if not only:
        return found
    chosen = []
    for key in only:
        key = key.strip()
        matches = [p for p in found if p.stem == key or p.stem.split("_", 1)[0] == key]
        if not matches:
            names = ", ".join(p.stem for p in found)
            raise ReportError(f"--notebooks: no notebook matches {key!r}; have: {names}")
        chosen += [m for m in matches if m not in chosen]
    return chosen


# ---- the site -------------------------------------------------------------------------------------
def write_index(report: Report) -> Path:
    e = html.escape
    rows = []
    for run in report.runs:
        link = f"<a href='html/{e(run.name)}.html'>{e(run.name)}</a>"
        ipynb = f"<a href='notebooks/{e(run.source.name)}'>.ipynb</a>"
        if run.ok:
            status = "<td class='ok'>ok</td>"
        else:
            status = f"<td class='failed'>FAILED: {e(run.error or '')}</td>"
        rows.append(f"<tr data-notebook='{e(run.name)}' data-ok='{str(run.ok).lower()}'>"
                    f"<td>{link}</td><td>{ipynb}</td>{status}<td>{run.seconds:.1f} s</td></tr>")
    if report.pngs:
        from kvlab.viz.export import caption  # lazy: the core never imports plotly (only with figures)

        figures = "".join(f"<figure><img src='figures/{e(p.name)}' alt='{e(caption(p.stem))}'>"
                          f"<figcaption>{e(caption(p.stem))}</figcaption></figure>" for p in report.pngs)
    else:
        figures = "" if report.figure_error else "<p>No figures (written with --no-png).</p>"
    if report.figure_error:
        figures = f"<p class='failed'>FAILED: {e(report.figure_error)}</p>" + figures
    tables = "".join(headline_html(h) for h in headlines(report.summary)) if report.summary else ""
    device = describe_device(report.device)
    page = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>kvlab report</title>
<style>
body{{font-family:system-ui,sans-serif;max-width:1150px;margin:2em auto;padding:0 1em;color:#1d1d1f;line-height:1.45}}
table{{border-collapse:collapse}} td,th{{padding:5px 12px;text-align:left;vertical-align:top}}
.kvlab-headline{{margin:0.5em 0 0.3em}} .kvlab-headline thead th{{border-bottom:2px solid #999;font-weight:600}} .kvlab-headline thead th+th{{text-align:right}}
.kvlab-headline tbody th{{font-weight:normal;color:#333}} .kvlab-headline tbody tr:nth-child(odd){{background:#f5f6f8}}
.kvlab-headline td{{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}}
.setting,.note{{color:#555;font-size:0.92em;margin:0.2em 0}} section.headline{{margin-bottom:1.6em}}
.ok{{color:#155724}} .failed{{color:#721c24;font-weight:bold}}
figure{{margin:1.5em 0}} figure img{{width:100%;height:auto;border:1px solid #e3e3e3}}
figcaption{{color:#333;margin-top:0.3em}}
</style></head>
<body><h1>kvlab report</h1>
<p>Notebooks ran on <b>{e(device)}</b> · {len(report.runs)} notebook(s), {len(report.failures)} failed ·
{report.seconds:.0f} s</p>
<table class="kvlab-report-notebooks"><tr><th>notebook</th><th>executed</th><th>status</th><th>time</th></tr>
{''.join(rows)}</table>
<h2>Headline numbers</h2>
{tables}
<p class="setting">All numbers come from kvlab.experiments with the notebooks' settings; raw values in
<a href="summary.json">summary.json</a>.</p>
<h2>Key figures</h2>{figures}
</body></html>
"""
    path = report.out_dir / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def _progress_line(line: str) -> None:
    """One line per step on stderr, as it finishes (a log or CI shows it too, unlike a redrawn bar)."""
    print(line, file=sys.stderr, flush=True)


def build_report(out: str | os.PathLike[str], *, device: str = "auto", notebooks: Sequence[str] | None = None,
                 notebook_dir: str | os.PathLike[str] = DEFAULT_NOTEBOOK_DIR, force: bool = False,
                 pngs: bool = True, progress: bool | None = None, timeout: int = 900) -> Report:
    """Run everything and write the site. A failing notebook is recorded (``report.failures``), the others
    still run, and the index marks it failed; the caller decides the exit status. Every notebook is read (and
    refused by name when unreadable) before anything is written. A signal stops it: :class:`ReportStopped`."""
    from kvlab.device import resolve_device_name
    from kvlab.notebook_exec import read_notebook

    if progress is None:
        progress = os.environ.get("KVLAB_PROGRESS", "1") != "0"
    report, manifest, sources, planned = None, None, [], []
    with stop_on_signals():
        try:
            start = time.perf_counter()
            sources = select_notebooks(Path(notebook_dir), notebooks)
            planned = planned_files(sources, pngs=pngs)
            check_out_dir(out, force=force, notebook_dir=notebook_dir, planned=planned)  # --out first, as before
            for source in sources:
                read_notebook(source)  # NotebookFormatError (a ValueError) naming it
            resolved = resolve_device_name(device)
            out_dir = prepare_out_dir(out, force=force, notebook_dir=notebook_dir, planned=planned)
            manifest = Manifest.read(out_dir) or Manifest(out_dir)
            manifest.make_folders([name for name in OUTPUT_FOLDERS if any(p.startswith(f"{name}/") for p in planned)])
            report = Report(out_dir=out_dir, device=resolved)
            _write_report(report, manifest, sources, pngs=pngs, timeout=timeout,
                          say=_progress_line if progress else (lambda _line: None))
            report.seconds = time.perf_counter() - start
            manifest.record(write_index(report))
        except Stopped as stop:
            raise ReportStopped(stop.signum, _record_when_stopped(stop, report, manifest, planned, len(sources))) \
                from None
    return report


def _record_when_stopped(stop: Stopped, report: Report | None, manifest: Manifest | None, planned: Sequence[str],
                         total: int) -> str:
    """Record in the manifest every file the stopped report wrote (all of ``planned`` that exists: none did before
    it started), and say so in a sentence."""
    if manifest is None:
        return f"report stopped by {stop.name} before it wrote anything"
    written = [manifest.out_dir / p for p in planned
               if (manifest.out_dir / p).is_file() and not (manifest.out_dir / p).is_symlink()]
    manifest.record(*written)
    index = "" if (manifest.out_dir / "index.html") in written else "; no index.html yet"
    return (f"report stopped by {stop.name} after {len(report.runs) if report else 0} of {total} notebook(s): the {len(written)} "
            f"file(s) written so far in {manifest.out_dir} are listed in its {MARKER}, so the next report into it "
            f"clears them{index}")


def _write_report(report: Report, manifest: Manifest, sources: Sequence[Path], *, pngs: bool, timeout: int,
                  say) -> None:
    """Everything but the index: plotly.js, the notebooks, summary.json and the PNGs, each recorded as written."""
    from kvlab.viz.export import plotly_js as read_plotly_js  # lazy: the core never imports plotly

    out_dir, resolved = report.out_dir, report.device
    plotly_js = read_plotly_js()
    shared_js = out_dir / PLOTLY_JS_FILE
    shared_js.write_text(plotly_js, encoding="utf-8")
    manifest.record(shared_js)
    for number, source in enumerate(sources, start=1):
        run = execute_one(source, out_dir, resolved, timeout=timeout, plotly_js=plotly_js)
        manifest.record(run.executed_path, run.html_path)
        report.runs.append(run)
        say(f"[{number}/{len(sources)}] {printable(source.stem)} … {run.seconds:.0f} s" + ("" if run.ok else " FAILED"))
    step = time.perf_counter()
    report.summary, arms, comparison = compute_summary(resolved)
    report.summary["notebooks"] = {r.name: {"ok": r.ok, "seconds": round(r.seconds, 2), "error": r.error}
                                   for r in report.runs}
    (out_dir / "summary.json").write_text(json.dumps(report.summary, indent=2) + "\n")
    manifest.record(out_dir / "summary.json")
    say(f"[summary] summary.json … {time.perf_counter() - step:.0f} s")
    if pngs:
        step = time.perf_counter()
        # lazy: the core never imports plotly
        from kvlab.viz.export import FIGURE_CAPTIONS, FigureExportError, key_figures, write_pngs

        figures = key_figures(arms, comparison)
        unplanned = set(figures) - set(FIGURE_CAPTIONS)
        if unplanned:  # prepare_out_dir checked FIGURE_CAPTIONS' names only
            raise ReportError(f"key figures without a caption (kvlab.viz.export.FIGURE_CAPTIONS): {sorted(unplanned)}")
        try:
            report.pngs = write_pngs(figures, out_dir / "figures")
        except FigureExportError as exc:
            report.figure_error = str(exc)
            report.pngs = [p for p in (out_dir / "figures" / f"{stem}.png" for stem in figures) if p.is_file()]
        manifest.record(*report.pngs)
        say(f"[figures] {len(report.pngs)} PNG{'s' if len(report.pngs) != 1 else ''} … "
            f"{time.perf_counter() - step:.0f} s")
