"""``kvlab report``: execute every notebook headless and write a static, offline site of the results.

    DIR/index.html                  links to each notebook's HTML page, failed ones marked
    DIR/notebooks/NN_name.ipynb     the executed copies (partly executed when a cell failed)
    DIR/html/NN_name.html           each notebook rendered by nbconvert, plotly.js inlined (works offline)
    DIR/figures/*.png               the findings' key figures as static images (kaleido)
    DIR/summary.json                headline numbers of both findings, both arms, computed by calling
                                    kvlab.experiments directly (never scraped from notebook outputs)
    DIR/.kvlab-report               marker: only a directory holding it may be written over again

Notebooks run in their own folder as cwd (as in JupyterLab) with ``KVLAB_DEVICE`` set in an injected first
cell (tag ``injected-env``, the convention of tests/notebooks/nbrun.py), so ``--device`` reaches
``kvlab.device.resolve_device_name`` inside the kernel. ``PLOTLY_RENDERER=plotly_mimetype+notebook`` makes
``fig.show()`` leave an HTML output (with plotly.js) that nbconvert can render; live FigureWidgets need a
kernel and show in the page as their static fallback only.
"""

from __future__ import annotations

import html
import json
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

MARKER = ".kvlab-report"
REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_NOTEBOOK_DIR = REPO_ROOT / "notebooks"
SUMMARY_PRESET = "sglang-pr-4xh200"
SUMMARY_WORKLOAD = "generated-shared-prefix"


class ReportError(RuntimeError):
    """Bad arguments or an output directory kvlab must not touch."""


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


@dataclass
class Report:
    out_dir: Path
    device: str
    runs: list[NotebookRun] = field(default_factory=list)
    summary: dict = field(default_factory=dict)
    pngs: list[Path] = field(default_factory=list)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.runs)

    @property
    def failures(self) -> list[NotebookRun]:
        return [r for r in self.runs if not r.ok]


# ---- choosing notebooks and the output directory ----------------------------------------------------
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


def prepare_out_dir(out: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Create ``out`` or clear a previous report in it. Refuses any other existing non-empty directory
    (the user's files) unless ``force``, and a path that is a file, always."""
    out = Path(out).resolve()
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {out}: exists and is not a directory")
    if out.is_dir() and any(out.iterdir()):
        if not (out / MARKER).is_file() and not force:
            raise ReportError(f"--out {out}: directory exists and is not a previous kvlab report "
                              f"(no {MARKER} file in it); choose another directory or pass --force")
        if (out / MARKER).is_file():  # ours: clear only what a report writes
            for name in ("notebooks", "html", "figures"):
                if (out / name).is_dir():
                    shutil.rmtree(out / name)
            for name in ("index.html", "summary.json"):
                (out / name).unlink(missing_ok=True)
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text("written by `kvlab report`; this directory may be overwritten by the next one\n")
    return out


# ---- executing and rendering --------------------------------------------------------------------
def _env_cell(env: dict[str, str]):
    import nbformat

    lines = ["# Environment injected by kvlab report", "import os"]
    lines += [f"os.environ[{k!r}] = {v!r}" for k, v in env.items()]
    cell = nbformat.v4.new_code_cell("\n".join(lines))
    cell.metadata["tags"] = ["injected-env"]
    return cell


def kernel_env(device: str) -> dict[str, str]:
    return {"KVLAB_DEVICE": device, "KVLAB_PROGRESS": "0", "PLOTLY_RENDERER": "plotly_mimetype+notebook"}


def execute_one(source: Path, out_dir: Path, device: str, *, timeout: int = 900) -> NotebookRun:
    """Execute ``source`` into ``out_dir/notebooks`` and render it into ``out_dir/html``; never raises for a
    failing cell (the run records it, the partial notebook is still written and rendered)."""
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    run = NotebookRun(name=source.stem, source=source)
    start = time.perf_counter()
    nb = nbformat.read(source, as_version=4)
    nb.cells.insert(0, _env_cell(kernel_env(device)))
    client = NotebookClient(nb, timeout=timeout, kernel_name="python3", store_widget_state=True,
                            resources={"metadata": {"path": str(source.parent)}})
    try:
        client.execute()
        run.ok = True
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        index = next((i for i, c in enumerate(nb.cells) if c.cell_type == "code" and any(
            o.get("output_type") == "error" for o in c.get("outputs", []))), None)
        run.failed_cell = None if index is None else index - 1  # the injected cell is not the user's
        where = f"cell {run.failed_cell}" if run.failed_cell is not None else "a cell"
        first_line = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        run.error = f"{source.name}: {where} failed ({type(exc).__name__}): {_strip_ansi(first_line)}"
    run.seconds = time.perf_counter() - start
    run.executed_path = out_dir / "notebooks" / source.name
    run.executed_path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, run.executed_path)
    run.html_path = out_dir / "html" / f"{source.stem}.html"
    run.html_path.parent.mkdir(parents=True, exist_ok=True)
    run.html_path.write_text(render_html(nb), encoding="utf-8")
    return run


def _strip_ansi(text: str) -> str:
    import re

    return re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)


def render_html(nb) -> str:
    """One offline page (nbconvert's lab template without its CDN scripts, math by inlined KaTeX: see
    ``kvlab.viz.offline``) over a copy whose widget outputs are replaced by static HTML from the saved widget
    state (figures as plotly divs, plotly.js inlined once): FigureWidgets need a kernel or a CDN, the page
    must work offline. ``fig.show()`` outputs carry their own plotly.js (PLOTLY_RENDERER)."""
    from kvlab.viz.export import static_widget_outputs  # lazy: the core never imports plotly
    from kvlab.viz.offline import render_notebook_html

    return render_notebook_html(static_widget_outputs(nb))


# ---- the numbers ----------------------------------------------------------------------------------
def compute_summary(device: str | None = None, *, preset: str = SUMMARY_PRESET,
                    workload: str = SUMMARY_WORKLOAD) -> tuple[dict, tuple, object]:
    """Both findings, both arms, from ``kvlab.experiments`` (the same calls as the CLI).

    ``device``: finding 1's device override (``None`` keeps the preset's simulated H200s; ``cuda`` measures
    the real GPU). Returns (summary dict, finding 1's arms, finding 2's comparison) so the figures are
    drawn from the very results whose numbers are reported."""
    from kvlab.experiments import kv_pool_sizing, shortfall_eviction

    pool_device = None if device in (None, "auto") or device.startswith("sim:") else device
    arms = kv_pool_sizing.compare(preset, device=pool_device)
    requests = shortfall_eviction.load_requests(workload=workload)
    comparison = shortfall_eviction.compare(requests, progress=False)

    def pool(result) -> dict:
        data = result.to_json()
        keys = ("max_total_num_tokens", "max_req_input_len", "available_bytes", "rest_bytes", "prompt_tokens",
                "accepted", "error")
        return {k: data[k] for k in keys}

    def sim(result) -> dict:
        totals = result.totals()
        keys = ("hit_rate", "over_evicted_tokens", "evicted_tokens", "prefill_tokens_computed", "requests")
        return {k: totals[k] for k in keys if k in totals}

    no_gc, with_gc = arms
    summary = {
        "finding1_kv_pool_sizing": {"preset": preset, "device": pool_device or "preset",
                                    "without_gc": pool(no_gc), "with_gc": pool(with_gc)},
        "finding2_shortfall_eviction": {"workload": workload, "shortfall": sim(comparison.shortfall),
                                        "full": sim(comparison.full)},
    }
    return summary, arms, comparison


# ---- the site -------------------------------------------------------------------------------------
def write_index(report: Report) -> Path:
    rows = []
    for run in report.runs:
        link = f"<a href='html/{html.escape(run.name)}.html'>{html.escape(run.name)}</a>"
        ipynb = f"<a href='notebooks/{html.escape(run.source.name)}'>.ipynb</a>"
        if run.ok:
            status = "<td class='ok'>ok</td>"
        else:
            status = f"<td class='failed'>FAILED: {html.escape(run.error or '')}</td>"
        rows.append(f"<tr data-notebook='{html.escape(run.name)}' data-ok='{str(run.ok).lower()}'>"
                    f"<td>{link}</td><td>{ipynb}</td>{status}<td>{run.seconds:.1f} s</td></tr>")
    figures = "".join(f"<figure><img src='figures/{p.name}' alt='{html.escape(p.stem)}' width='720'>"
                      f"<figcaption>{html.escape(p.stem)}</figcaption></figure>" for p in report.pngs)
    summary = html.escape(json.dumps(report.summary, indent=2))
    page = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>kvlab report</title>
<style>body{{font-family:sans-serif;max-width:1100px;margin:2em auto}} td{{padding:4px 10px}}
.ok{{color:#155724}} .failed{{color:#721c24;font-weight:bold}} pre{{background:#f6f6f6;padding:8px}}</style></head>
<body><h1>kvlab report</h1>
<p>device: <code>{html.escape(report.device)}</code> · {len(report.runs)} notebook(s),
{len(report.failures)} failed · {report.seconds:.0f} s</p>
<table class="kvlab-report-notebooks"><tr><th>notebook</th><th>executed</th><th>status</th><th>time</th></tr>
{''.join(rows)}</table>
<h2>Headline numbers (<a href="summary.json">summary.json</a>)</h2><pre>{summary}</pre>
<h2>Key figures</h2>{figures}
</body></html>
"""
    path = report.out_dir / "index.html"
    path.write_text(page, encoding="utf-8")
    return path


def build_report(out: str | os.PathLike[str], *, device: str = "auto", notebooks: Sequence[str] | None = None,
                 notebook_dir: str | os.PathLike[str] = DEFAULT_NOTEBOOK_DIR, force: bool = False,
                 pngs: bool = True, progress: bool | None = None, timeout: int = 900) -> Report:
    """Run everything and write the site. A failing notebook is recorded (``report.failures``), the others
    still run, and the index marks it failed; the caller decides the exit status."""
    from kvlab.device import resolve_device_name
    from kvlab.progress import progress_bar

    start = time.perf_counter()
    sources = select_notebooks(Path(notebook_dir), notebooks)
    resolved = resolve_device_name(device)
    out_dir = prepare_out_dir(out, force=force)
    report = Report(out_dir=out_dir, device=resolved)
    with progress_bar(total=len(sources) + 2, desc="kvlab report", enabled=progress, unit="step") as bar:
        for source in sources:
            bar.set_postfix_str(source.stem)
            report.runs.append(execute_one(source, out_dir, resolved, timeout=timeout))
            bar.update()
        bar.set_postfix_str("summary")
        report.summary, arms, comparison = compute_summary(resolved)
        report.summary["notebooks"] = {r.name: {"ok": r.ok, "seconds": round(r.seconds, 2), "error": r.error}
                                       for r in report.runs}
        (out_dir / "summary.json").write_text(json.dumps(report.summary, indent=2) + "\n")
        bar.update()
        if pngs:
            bar.set_postfix_str("figures")
            from kvlab.viz.export import key_figures, write_pngs  # lazy: the core never imports plotly

            report.pngs = write_pngs(key_figures(arms, comparison), out_dir / "figures")
        bar.update()
    report.seconds = time.perf_counter() - start
    write_index(report)
    return report
