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

import contextlib
import hashlib
import html
import json
import os
import stat
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kvlab.paths import notebook_dir
from kvlab.safe_text import printable
from kvlab.stop_signals import Stopped, stop_on_signals
from kvlab.units import (
    DIFFERENCE,
    DIFFERENCE_HEADER,
    MiB,
    fmt_bytes,
    fmt_points,
    fmt_signed_bytes,
    fmt_signed_int,
)

MARKER = ".kvlab-report"  # the manifest (JSON): {"kvlab_report_manifest": 1, "files": {relative path: sha256},
# "folders": [the report folders it made]}
MANIFEST_FORMAT = 1
_LEGACY_MARKER = "written by `kvlab report`; this directory may be overwritten by the next one\n"  # kvlab <= this
OUTPUT_FOLDERS = ("notebooks", "html", "figures")
MAX_MANIFEST_BYTES = 16 * MiB  # a report's manifest is a few kB
DEFAULT_NOTEBOOK_DIR = notebook_dir()  # the checkout's notebooks/, a wheel's copy or KVLAB_NOTEBOOK_DIR
# The headline numbers are those the notebooks show (tests/test_report.py reads the notebooks' own calls):
# finding 1 is notebook 01 §1, the PR's setup on its simulated devices, plus §4 on a CUDA device when the
# report runs on one; finding 2 is notebook 02 §2, shortfall_eviction.PANEL_DEFAULTS (the live panel's setting).
SUMMARY_PRESET = "sglang-pr-4xh200"
SUMMARY_GPU_PRESET = "llama-8b-l4"


class ReportError(RuntimeError):
    """Bad arguments or an output directory kvlab must not touch."""


class ReportStopped(Stopped):
    """A signal stopped the report; ``message`` says what was written (every file of it is in the manifest)."""

    def __init__(self, signum: int, message: str) -> None:
        super().__init__(signum)
        self.message = message


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
    figure_error: str | None = None  # the PNG export's error, when kaleido failed (the rest is still written)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.runs) and self.figure_error is None

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


def _sha256(path: Path | str, dir_fd: int | None = None) -> str | None:
    """The SHA-256 of a regular file (not through a symlink, relative to ``dir_fd`` if given); ``None`` for
    anything else (a FIFO is opened without blocking, then refused)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    except (OSError, ValueError):
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        digest = hashlib.sha256()
        for chunk in iter(lambda: f.read(MiB), b""):
            digest.update(chunk)
    return digest.hexdigest()


def _entry_problem(relative: object) -> str | None:
    """Why a manifest's file entry is not a path a report writes inside its folder (``None`` when it is one):
    a report writes ``NAME`` and ``FOLDER/NAME`` (FOLDER one of ``OUTPUT_FOLDERS``), nothing else."""
    if not isinstance(relative, str) or not relative or "\0" in relative:
        return "not a file name"
    parts = relative.split("/")
    if relative.startswith("/"):
        return "an absolute path"
    if ".." in parts:
        return "a path out of the folder"
    if "" in parts or "." in parts or len(parts) > 2 or (len(parts) == 2 and parts[0] not in OUTPUT_FOLDERS) \
            or relative == MARKER:
        return "a path no report writes"
    return None


class Manifest:
    """``DIR/.kvlab-report``: the files a report wrote in ``DIR`` (relative path → SHA-256) and the report folders
    it made, rewritten after each file is recorded, so an interrupted report still proves what it wrote."""

    def __init__(self, out_dir: Path, files: dict[str, str] | None = None, folders: Sequence[str] = ()) -> None:
        self.out_dir, self.files, self.folders = out_dir, dict(files or {}), list(folders)

    @property
    def path(self) -> Path:
        return self.out_dir / MARKER

    @classmethod
    def read(cls, out_dir: Path) -> Manifest | None:
        """The manifest of ``out_dir``; ``None`` when there is none. A marker of an older kvlab (which ``--force``
        could write into any folder) proves nothing: an empty manifest. Anything else there is refused, and so
        is a manifest naming a path a report never writes (outside ``out_dir``, through ``..``): nothing is
        deleted on its word."""
        path = out_dir / MARKER
        if not path.exists() and not path.is_symlink():
            return None
        text = _read_small(path)
        if text == _LEGACY_MARKER:
            return cls(out_dir)
        try:
            data = json.loads(text) if text is not None else None
        except (ValueError, RecursionError):
            data = None
        files = data.get("files") if isinstance(data, dict) and data.get("kvlab_report_manifest") == MANIFEST_FORMAT \
            else None
        folders = data.get("folders", []) if isinstance(data, dict) else None
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in files.items()) \
                or not isinstance(folders, list):
            raise ReportError(f"--out {out_dir}: {MARKER} there is not a kvlab report manifest; kvlab does not write "
                              f"over it: choose another directory")
        bad = [(entry, why) for entry in files if (why := _entry_problem(entry))]
        bad += [(entry, "not a report folder") for entry in folders if entry not in OUTPUT_FOLDERS]
        if bad:
            shown = ", ".join(f"{entry!r} ({why})" for entry, why in bad[:3]) + (
                f" and {len(bad) - 3} more" if len(bad) > 3 else "")
            raise ReportError(f"--out {out_dir}: {MARKER} lists {shown}: a kvlab report writes only inside its "
                              f"folder and never lists that; nothing was deleted. Remove {MARKER} if the folder "
                              f"is yours, or choose another directory")
        return cls(out_dir, files, folders)

    def _open_folder(self, relative: str) -> tuple[int, str]:
        """A descriptor of the folder holding ``relative`` (reached from ``out_dir`` without following a link)
        and the file's name in it; OSError when a folder on the way is a link or missing."""
        *folders, name = relative.split("/")
        fd = os.open(self.out_dir, os.O_RDONLY | os.O_DIRECTORY)
        try:
            for folder in folders:
                inner = os.open(folder, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW, dir_fd=fd)
                os.close(fd)
                fd = inner
        except BaseException:
            os.close(fd)
            raise
        return fd, name

    def owns(self, relative: str) -> bool:
        """Whether the file at ``relative`` is one this manifest proves a report wrote (unchanged since), reached
        inside ``out_dir`` without a link."""
        return self._owned(relative, remove=False)

    def remove_owned(self, relative: str) -> bool:
        """Delete the file at ``relative`` if :meth:`owns` it; whether it did."""
        return self._owned(relative, remove=True)

    def _owned(self, relative: str, *, remove: bool) -> bool:
        recorded = self.files.get(relative)
        if recorded is None or _entry_problem(relative):
            return False
        try:
            fd, name = self._open_folder(relative)
        except OSError:
            return False
        try:
            if _sha256(name, dir_fd=fd) != recorded:
                return False
            if remove:
                os.unlink(name, dir_fd=fd)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def remove_empty_folders(self) -> None:
        """Remove each report folder this manifest says a report made, if it is empty now (never a link); the ones
        left stay recorded."""
        kept = []
        for name in self.folders:
            try:
                os.rmdir(self.out_dir / name)  # a link is no directory to rmdir: ENOTDIR, left alone
            except FileNotFoundError:
                continue
            except OSError:
                kept.append(name)
        self.folders = kept

    def make_folders(self, names: Sequence[str]) -> None:
        """Create the report folders ``names`` that do not exist, recording them as the report's own."""
        for name in names:
            folder = self.out_dir / name
            if not folder.exists() and not folder.is_symlink():
                folder.mkdir()
                self.folders.append(name)
        self.save()

    def record(self, *paths: Path | None) -> None:
        for path in paths:
            if path is not None and Path(path).is_file():
                relative = Path(path).resolve().relative_to(self.out_dir).as_posix()
                self.files[relative] = _sha256(Path(path)) or ""
        self.save()

    def save(self) -> None:
        content: dict = {"kvlab_report_manifest": MANIFEST_FORMAT, "files": dict(sorted(self.files.items()))}
        if self.folders:
            content["folders"] = sorted(set(self.folders))
        data = json.dumps(content, indent=1) + "\n"
        fd, tmp = tempfile.mkstemp(dir=self.out_dir, prefix=f"{MARKER}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(data)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


def _read_small(path: Path) -> str | None:
    """The text of the regular file ``path`` (not through a link) if it is at most ``MAX_MANIFEST_BYTES``."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError:
        return None
    with os.fdopen(fd, "rb") as f:
        if not stat.S_ISREG(os.fstat(fd).st_mode) or os.fstat(fd).st_size > MAX_MANIFEST_BYTES:
            return None
        try:
            return f.read(MAX_MANIFEST_BYTES + 1).decode("utf-8")
        except (OSError, UnicodeDecodeError):
            return None


def _same_dir(a: Path, b: Path) -> bool:
    try:
        return a.resolve() == b.resolve() or (a.exists() and b.exists() and os.path.samefile(a, b))
    except OSError:
        return False


def prepare_out_dir(out: str | os.PathLike[str], *, force: bool = False, notebook_dir: str | os.PathLike[str] | None = None,
                    planned: Sequence[str] = ()) -> Path:
    """Create ``out``, or clear a previous report in it: the files its manifest proves a report wrote (unchanged
    since, reached without a link), and then the report folders it made if they are left empty; nothing else.
    Refuses any other existing non-empty directory unless ``force``; a path that is a file; a manifest naming a
    path no report writes; a report folder the ``planned`` files go into that is a link or not a folder; a
    ``notebook_dir`` that is ``out`` or one of its report folders; and any of the ``planned`` files (paths relative
    to ``out``) that exists and is not proven kvlab's: the report never writes over a file it did not write."""
    out, manifest = check_out_dir(out, force=force, notebook_dir=notebook_dir, planned=planned)
    if manifest is not None:  # ours: delete only what it proves it wrote
        for relative in list(manifest.files):
            manifest.remove_owned(relative)
        manifest.remove_empty_folders()
    taken = [p for p in planned if (out / p).exists() or (out / p).is_symlink()]
    if taken:
        shown = ", ".join(taken[:5]) + (f" and {len(taken) - 5} more" if len(taken) > 5 else "")
        raise ReportError(f"--out {out}: {shown} already there and not written by kvlab report (or changed since); "
                          f"kvlab never writes over a file it did not write: move it away or choose another "
                          f"directory")
    out.mkdir(parents=True, exist_ok=True)
    # what was proven is gone; a file someone changed is theirs now; a folder the report made and still holds
    # someone's file stays the report's (removed once empty)
    Manifest(out, folders=manifest.folders if manifest is not None else ()).save()
    return out


def check_out_dir(out: str | os.PathLike[str], *, force: bool = False,
                  notebook_dir: str | os.PathLike[str] | None = None,
                  planned: Sequence[str] = ()) -> tuple[Path, Manifest | None]:
    """``prepare_out_dir``'s refusals that need nothing deleted first, touching nothing: the resolved ``out`` and
    its manifest (``None`` when there is none)."""
    out = Path(out).resolve()
    if out.exists() and not out.is_dir():
        raise ReportError(f"--out {out}: exists and is not a directory")
    base = next(p for p in out.parents if p.exists()) if not out.exists() else out
    if not base.is_dir() or not os.access(base, os.W_OK | os.X_OK):
        raise ReportError(f"--out {out}: cannot be created ({base} is {'not a folder' if not base.is_dir() else 'not writable'})")
    if notebook_dir is not None:
        for target in (out, *(out / name for name in OUTPUT_FOLDERS)):
            if _same_dir(Path(notebook_dir), target):
                raise ReportError(f"--notebook-dir {notebook_dir}: the notebooks' own folder is where this report "
                                  f"would write ({target}); kvlab never writes into or clears the notebooks' "
                                  f"folder: choose another --out")
    manifest = Manifest.read(out) if out.is_dir() else None
    if out.is_dir() and any(out.iterdir()) and manifest is None and not force:
        raise ReportError(f"--out {out}: directory exists and is not a previous kvlab report "
                          f"(no {MARKER} file in it); choose another directory or pass --force "
                          f"(which writes beside the files there, never over one)")
    for name in sorted({p.split("/")[0] for p in planned if "/" in p}):
        folder = out / name
        if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
            what = "a link" if folder.is_symlink() else "not a folder"
            raise ReportError(f"--out {out}: {name} there is {what}; kvlab report writes only inside its own "
                              f"folder, never through a link: move it away or choose another directory")
    return out, manifest


def planned_files(sources: Sequence[Path], *, pngs: bool) -> list[str]:
    """Every file a report of ``sources`` writes, relative to its directory (the manifest aside)."""
    files = ["index.html", "summary.json", PLOTLY_JS_FILE]
    for source in sources:
        files += [f"notebooks/{source.name}", f"html/{source.stem}.html"]
    if pngs:
        from kvlab.viz.export import FIGURE_CAPTIONS  # lazy: the core never imports plotly (only with figures)

        files += [f"figures/{stem}.png" for stem in FIGURE_CAPTIONS]
    return files


# ---- executing and rendering --------------------------------------------------------------------
def kernel_env(device: str) -> dict[str, str]:
    # KVLAB_STATIC: the page is read without a kernel, so panels word their hints for it (kvlab.viz.wording)
    return {"KVLAB_DEVICE": device, "KVLAB_PROGRESS": "0", "PLOTLY_RENDERER": "plotly_mimetype+notebook",
            "KVLAB_STATIC": "1"}


PLOTLY_JS_FILE = "html/plotly.min.js"  # plotly.js once for the whole report, beside the pages that load it


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
    """``page`` with the build machine's folders (``roots``: prefix -> shown instead) taken out of every path."""
    for prefix, shown in roots.items():
        page = page.replace(prefix, shown)
    return page


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
    page = strip_build_paths(page, build_paths() | {str(source.parent.resolve().parent) + os.sep: ""})
    run.html_path.write_text(page, encoding="utf-8")
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


# ---- the numbers ----------------------------------------------------------------------------------
def describe_device(name: str) -> str:
    """A device name in words: ``simulated NVIDIA H200 141 GB HBM3e (sim:h200)``, ``NVIDIA H200 (cuda:0)``."""
    if name.startswith("sim:"):
        from kvlab.device import get_device_spec

        spec = get_device_spec(name[4:])
        return f"simulated {spec.description or spec.name} ({name})"
    if name == "cuda" or name.startswith("cuda:"):
        import torch

        if not torch.cuda.is_available():
            return f"{name} (no CUDA device visible)"
        index = int(name.split(":", 1)[1]) if ":" in name else torch.cuda.current_device()
        return f"{torch.cuda.get_device_name(index)} (cuda:{index})"
    return name


def _pool_arm(result) -> dict:
    data = result.to_json()
    keys = ("max_total_num_tokens", "max_req_input_len", "available_bytes", "rest_bytes", "kv_pool_bytes",
            "prompt_tokens", "accepted", "error")
    return {k: data[k] for k in keys}


def _pool_finding(arms, device: str, source: str) -> dict:
    no_gc, with_gc = arms
    scenario = no_gc.scenario
    ranks = f"{scenario.tp_size} × " if scenario.tp_size > 1 else ""
    return {"source": source, "preset": scenario.name, "model": scenario.model, "tp_size": scenario.tp_size,
            "device": device, "device_description": ranks + describe_device(device),
            "without_gc": _pool_arm(no_gc), "with_gc": _pool_arm(with_gc),
            "difference": _json_difference(_pool_arm(no_gc), _pool_arm(with_gc), "with_gc - without_gc")}


def _json_difference(bug: dict, fix: dict, of: str) -> dict:
    """summary.json's ``difference`` of one finding: fix − bug (kvlab.units' convention) of every numeric field."""
    out: dict = {"of": f"{of} ({DIFFERENCE})"}
    for key, b in bug.items():
        a = fix.get(key)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and not isinstance(a, bool) \
                and not isinstance(b, bool):
            out[key] = round(a - b, 6) if isinstance(a, float) or isinstance(b, float) else a - b
    return out


def compute_summary(device: str | None = None, *, preset: str = SUMMARY_PRESET) -> tuple[dict, tuple, object]:
    """Both findings, both arms, from ``kvlab.experiments`` with the notebooks' settings (the same calls as
    notebook 01 §1 and notebook 02 §2).

    ``device``: the report's device (``--device``, resolved). Finding 1's headline runs ``preset`` on its own
    simulated devices, as the notebook does; when ``device`` is CUDA, ``finding1_on_this_gpu`` adds notebook
    01 §4, ``SUMMARY_GPU_PRESET`` measured on it. Returns (summary dict, finding 1's arms, finding 2's
    comparison) so the figures are drawn from the very results whose numbers are reported."""
    from kvlab.experiments import kv_pool_sizing, shortfall_eviction

    arms = kv_pool_sizing.compare(preset)
    settings = shortfall_eviction.PANEL_DEFAULTS
    comparison = shortfall_eviction.panel_comparison(settings, progress=False)

    def sim(result) -> dict:
        totals = result.totals()
        keys = ("hit_rate", "cached_prompt_tokens", "prompt_tokens", "over_evicted_tokens", "evicted_tokens",
                "prefill_tokens_computed", "reprefill_tokens", "pressure_events", "requests")
        return {k: totals[k] for k in keys if k in totals}

    summary = {"device": {"name": device, "description": describe_device(device)} if device else None,
               "finding1_kv_pool_sizing": _pool_finding(arms, arms[0].scenario.device, "notebook 01, section 1")}
    if device and device.startswith("cuda"):
        gpu_arms = kv_pool_sizing.compare(SUMMARY_GPU_PRESET, device=device)
        summary["finding1_on_this_gpu"] = _pool_finding(gpu_arms, device, "notebook 01, section 4")
    summary["finding2_shortfall_eviction"] = {
        "source": "notebook 02, section 2 (shortfall_eviction.PANEL_DEFAULTS)", "workload": settings.workload,
        "seed": settings.seed, "overrides": settings.workload_overrides(), "kv_tokens": settings.kv_tokens,
        "page_size": settings.page_size, "policy": settings.policy,
        "device_description": "no device: a scheduler simulation that counts KV-pool slots",
        "full": sim(comparison.full), "shortfall": sim(comparison.shortfall),
        "difference": _json_difference(sim(comparison.full), sim(comparison.shortfall), "shortfall - full")}
    return summary, arms, comparison


# ---- the headline table -------------------------------------------------------------------------------
def _int(n: int) -> str:
    return f"{n:,}".replace("-", "−")


def _signed_int(n: int) -> str:
    return fmt_signed_int(n)


def _pct(x: float) -> str:
    return f"{100 * x:.2f} %"


def _signed_points(points: float) -> str:
    return fmt_points(points, "percentage points")


def _gib(n: int) -> str:  # bytes, the unit chosen by magnitude (kvlab.units.fmt_bytes, as every surface)
    return fmt_bytes(n).replace("-", "−")


def _signed_gib(n: int) -> str:
    return fmt_signed_bytes(n)


@dataclass(frozen=True)
class Headline:
    """One finding's table: a sentence, the two arms' column names (bug first, then fix) and rows of
    (what, bug, fix, fix − bug), every cell already in words and formatted numbers."""

    title: str
    setting: str
    sentence: str
    arms: tuple[str, str]
    rows: list[tuple[str, str, str, str]]
    note: str = ""


def _pool_headline(f1: dict, title: str) -> Headline:
    bug, fix = f1["without_gc"], f1["with_gc"]
    tokens_bug, tokens_fix = bug["max_total_num_tokens"], fix["max_total_num_tokens"]
    ratio = f" ({tokens_fix / tokens_bug:,.1f}×)" if tokens_bug else ""
    prompt = f"{_int(fix['prompt_tokens'])}-token prompt"

    def verdict(arm: dict) -> str:
        return "accepted" if arm["accepted"] else "refused"

    rows = [
        ("KV pool size (max_total_num_tokens)", f"{_int(tokens_bug)} tokens", f"{_int(tokens_fix)} tokens",
         f"{_signed_int(tokens_fix - tokens_bug)} tokens{ratio}"),
        ("longest prompt allowed (max_req_input_len)", _int(bug["max_req_input_len"] or 0) + " tokens",
         _int(fix["max_req_input_len"] or 0) + " tokens",
         _signed_int((fix["max_req_input_len"] or 0) - (bug["max_req_input_len"] or 0)) + " tokens"),
        ("free memory measured after loading (min over ranks)", _gib(bug["available_bytes"]), _gib(fix["available_bytes"]),
         _signed_gib(fix["available_bytes"] - bug["available_bytes"])),
        (f"the {prompt}", verdict(bug), verdict(fix), "" if bug["accepted"] == fix["accepted"] else
         f"{verdict(bug)} → {verdict(fix)}"),
    ]
    sentence = (f"With gc.collect() before the memory reading SGLang sizes a KV pool of {_int(tokens_fix)} tokens "
                f"instead of {_int(tokens_bug)}{ratio.replace('×', '× as many')}; the {prompt} is {verdict(bug)} without it and "
                f"{verdict(fix)} with it.")
    errors = [f"{arm}: {f1[key]['error']}" for arm, key in (("without gc.collect()", "without_gc"),
                                                             ("with gc.collect()", "with_gc")) if f1[key]["error"]]
    setting = (f"preset {f1['preset']}: {f1['model']}, TP{f1['tp_size']}, on {f1['device_description']} "
               f"— {f1['source']}")
    return Headline(title, setting, sentence, ("without gc.collect() (the bug)", "with gc.collect() (the fix)"),
                    rows, note="SGLang's message — " + " · ".join(errors) if errors else "")


def _eviction_headline(f2: dict) -> Headline:
    bug, fix = f2["full"], f2["shortfall"]
    points = 100 * (fix["hit_rate"] - bug["hit_rate"])
    verb = "raises" if points > 0 else "lowers" if points < 0 else "leaves"
    rows = [("prefix-cache hit rate", _pct(bug["hit_rate"]), _pct(fix["hit_rate"]),
             _signed_points(points))]
    for key, label in (("over_evicted_tokens", "tokens evicted beyond the shortfall (over-evicted)"),
                       ("evicted_tokens", "tokens evicted"),
                       ("prefill_tokens_computed", "prefill tokens computed"),
                       ("reprefill_tokens", "… of them prefilled again after a retraction"),
                       ("pressure_events", "memory-pressure events"),
                       ("requests", "requests")):
        if key in bug and key in fix:
            rows.append((label, _int(bug[key]), _int(fix[key]), _signed_int(fix[key] - bug[key])))
    overrides = ", ".join(f"{k}={_int(v) if isinstance(v, int) else v}" for k, v in f2["overrides"].items())
    pages = f", {_int(f2['page_size'])}-token pages" if f2.get("page_size", 1) != 1 else ""
    policy = f", {f2['policy']} eviction policy" if f2.get("policy") else ""
    setting = (f"workload {f2['workload']} (seed {f2['seed']}, {overrides}) through a {_int(f2['kv_tokens'])}-token "
               f"KV pool{pages}{policy} — {f2['device_description']} — {f2['source']}")
    extra = bug["prefill_tokens_computed"] - fix["prefill_tokens_computed"]
    recomputed = (f"{_int(extra)} more prefill tokens" if extra > 0 else f"{_int(-extra)} fewer prefill tokens"
                  if extra < 0 else "as many prefill tokens")
    if extra and all(k in arm for arm in (bug, fix) for k in ("cached_prompt_tokens", "reprefill_tokens")):
        lost, again = fix["cached_prompt_tokens"] - bug["cached_prompt_tokens"], bug["reprefill_tokens"] - fix["reprefill_tokens"]
        show = _int if lost >= 0 and again >= 0 else _signed_int  # parts of "more": plain counts when both add
        recomputed += (f" ({show(lost)} prompt tokens it did not find in the cache, {show(again)} "
                       f"prefilled again after retractions)")
    sentence = (f"Evicting only the shortfall {verb} the prefix-cache hit rate from {_pct(bug['hit_rate'])} to "
                f"{_pct(fix['hit_rate'])} ({_signed_points(points)}); full eviction over-evicted "
                f"{_int(bug['over_evicted_tokens'])} tokens and computed {recomputed}.")
    return Headline("Finding 2 · evict only the shortfall", setting, sentence,
                    ("full eviction, SGLang ≤ 0.5.16 (the bug)", "shortfall eviction, SGLang ≥ 0.5.17 (the fix)"),
                    rows)


def headlines(summary: dict) -> list[Headline]:
    """The findings of ``summary`` (as ``compute_summary`` makes it) as readable tables."""
    out = [_pool_headline(summary["finding1_kv_pool_sizing"], "Finding 1 · measure the KV budget after collecting")]
    if "finding1_on_this_gpu" in summary:
        out.append(_pool_headline(summary["finding1_on_this_gpu"], "Finding 1 on this GPU"))
    out.append(_eviction_headline(summary["finding2_shortfall_eviction"]))
    return out


def _headline_html(h: Headline) -> str:
    e = html.escape
    rows = "".join(f"<tr><th scope='row'>{e(what)}</th><td>{e(bug)}</td><td>{e(fix)}</td><td>{e(diff)}</td></tr>"
                   for what, bug, fix, diff in h.rows)
    note = f"<p class='note'>{e(h.note)}</p>" if h.note else ""
    return (f"<section class='headline'><h3>{e(h.title)}</h3><p>{e(h.sentence)}</p>"
            f"<p class='setting'>{e(h.setting)}</p>"
            f"<table class='kvlab-headline'><thead><tr><th></th><th>{e(h.arms[0])}</th><th>{e(h.arms[1])}</th>"
            f"<th>{e(DIFFERENCE_HEADER)}</th></tr></thead><tbody>{rows}</tbody></table>{note}</section>")


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
    tables = "".join(_headline_html(h) for h in headlines(report.summary)) if report.summary else ""
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
