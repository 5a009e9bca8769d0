"""Drive a real JupyterLab from Playwright: start the server, open and run a notebook, read widgets and plots.

Recipes and pitfalls: docs/testing.md#browser-tests. Widgets are located by the CSS classes the notebook gives them
(``widget.add_class("kvlab-...")``), never by cell position or by ``get_by_text`` (which also matches
cell source). Locators are strict: a class that matches two elements (e.g. a panel displayed twice, or
widgets replayed from an old kernel) is an error, not a silent pick of the first.

    lab.open_notebook(page, server, "notebooks/01_kv_pool_sizing.ipynb")
    lab.run_all(page)
    lab.wait_for_output_text(page, "kvlab-ready")
    before = lab.wait_plotly(page, ".kvlab-pool-fig")
    lab.click_widget(page, "kvlab-gc-toggle")
    after = lab.wait_plotly_change(page, ".kvlab-pool-fig", before)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from playwright.sync_api import Locator, Page, expect

# -- server ---------------------------------------------------------------------------------------

# Written into the isolated user-settings dir. autosave off: a run longer than the 120 s autosave
# interval would otherwise write outputs (MBs of widget state) back into the repo's notebooks.
# windowingMode "none": every cell stays in the DOM, so off-screen outputs can be found and read.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker": {"windowingMode": "none"},
    "@jupyterlab/apputils-extension/notification": {"fetchNews": "false", "checkForUpdates": False},
    "@jupyterlab/extensionmanager-extension/plugin": {"enabled": False},
}


@dataclass
class LabServer:
    url: str  # http://127.0.0.1:PORT, no trailing slash
    root_dir: Path
    process: subprocess.Popen
    log_path: Path

    def api(self, method: str, path: str, body: Any = None, timeout: float = 10.0) -> Any:
        """Call the REST API (xsrf checks are off, token is empty); returns parsed JSON or None."""
        data = json.dumps(body).encode() if body is not None else None
        request = urllib.request.Request(f"{self.url}{path}", data=data, method=method)
        request.add_header("Content-Type", "application/json")
        with urllib.request.urlopen(request, timeout=timeout) as response:
            payload = response.read()
        return json.loads(payload) if payload else None

    def sessions(self, path: str | None = None) -> list[dict]:
        """Live sessions, optionally only those of the notebook at ``path`` (relative to root_dir)."""
        return [s for s in self.api("GET", "/api/sessions") if path is None or s.get("path") == path]

    def delete_sessions(self, path: str | None = None) -> int:
        """Delete sessions (and so shut down their kernels): of ``path``, or all. Returns how many."""
        doomed = self.sessions(path)
        for session in doomed:
            try:
                self.api("DELETE", f"/api/sessions/{session['id']}", timeout=30)
            except urllib.error.HTTPError as exc:
                if exc.code != 404:  # already gone
                    raise
        return len(doomed)

    def log_tail(self, n_chars: int = 4000) -> str:
        return self.log_path.read_text(errors="replace")[-n_chars:] if self.log_path.exists() else ""

    def stop(self, timeout: float = 20.0) -> None:
        """Shut down every kernel and the server (POST /api/shutdown), then make sure the process is gone."""
        if self.process.poll() is None:
            try:
                self.api("POST", "/api/shutdown", timeout=timeout)
            except (OSError, urllib.error.URLError):
                pass  # the server may close the connection while it stops
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.terminate()
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _write_lab_settings(settings_dir: Path) -> None:
    for plugin, values in LAB_SETTINGS.items():
        package, name = plugin.rsplit("/", 1)
        target = settings_dir / package / f"{name}.jupyterlab-settings"
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(values))


def start_lab(root_dir: Path, work_dir: Path, startup_timeout: float = 120.0) -> LabServer:
    """Start ``jupyter lab`` on a free loopback port with its config/data/runtime dirs under ``work_dir``.

    Returns once /api/status answers. The flags are the ones in docs/testing.md#browser-tests; the isolated dirs keep
    a user's own kernelspecs, settings and workspaces out of the test.
    """
    work_dir.mkdir(parents=True, exist_ok=True)
    names = ("config", "data", "runtime", "ipython", "workspaces", "lsp", "checkpoints")
    dirs = {name: work_dir / name for name in names}
    for d in dirs.values():
        d.mkdir(exist_ok=True)
    settings_dir = dirs["config"] / "lab" / "user-settings"
    _write_lab_settings(settings_dir)
    env = {
        **os.environ,
        "JUPYTER_PLATFORM_DIRS": "1",
        "JUPYTER_CONFIG_DIR": str(dirs["config"]),
        "JUPYTER_DATA_DIR": str(dirs["data"]),
        "JUPYTER_RUNTIME_DIR": str(dirs["runtime"]),
        "JUPYTERLAB_SETTINGS_DIR": str(settings_dir),
        "JUPYTERLAB_WORKSPACES_DIR": str(dirs["workspaces"]),
        "IPYTHONDIR": str(dirs["ipython"]),
        "JP_LSP_VIRTUAL_DIR": str(dirs["lsp"]),  # else jupyter-lsp may write .virtual_documents/ into the repo
    }
    port = free_port()
    cmd = [
        sys.executable, "-m", "jupyterlab",
        "--no-browser",
        f"--port={port}",
        "--ServerApp.port_retries=0",  # fail loudly rather than serve on a port we do not know
        "--ServerApp.ip=127.0.0.1",
        "--ServerApp.token=",
        "--ServerApp.password=",
        "--ServerApp.disable_check_xsrf=True",
        f"--ServerApp.root_dir={root_dir}",
        "--LabApp.expose_app_in_browser=True",
        "--LabApp.news_url=None",
        "--LabApp.check_for_updates_class=jupyterlab.NeverCheckForUpdate",
        # Opening a notebook creates a checkpoint; keep it out of the repo (default: .ipynb_checkpoints/
        # next to the notebook). An absolute dir is used as is, one flat dir for the whole run.
        f"--FileCheckpoints.checkpoint_dir={dirs['checkpoints']}",
    ]
    if hasattr(os, "geteuid") and os.geteuid() == 0:
        cmd.append("--allow-root")
    log_path = work_dir / "jupyterlab.log"
    with log_path.open("wb") as log:
        process = subprocess.Popen(cmd, cwd=root_dir, env=env, stdout=log, stderr=subprocess.STDOUT)
    server = LabServer(f"http://127.0.0.1:{port}", Path(root_dir), process, log_path)
    deadline = time.monotonic() + startup_timeout
    while True:
        if process.poll() is not None:
            raise RuntimeError(f"jupyter lab exited with {process.returncode}:\n{server.log_tail()}")
        try:
            server.api("GET", "/api/status", timeout=2)
            return server
        except (OSError, urllib.error.URLError):
            pass
        if time.monotonic() > deadline:
            server.stop()
            raise TimeoutError(f"jupyter lab did not answer /api/status in {startup_timeout}s:\n{server.log_tail()}")
        time.sleep(0.25)


# -- kvlab app (the real CLI) ----------------------------------------------------------------------

REPO = Path(__file__).resolve().parents[2]
APP_SERVING = r"serving \S+ at (\S+) \(Ctrl-C to stop\)"  # the line `kvlab app` prints with its URL (and token)


@dataclass
class KvlabApp:
    """``kvlab app`` as :func:`kvlab_app` started it."""

    process: subprocess.Popen
    log_path: Path
    url: str  # http://127.0.0.1:PORT/, without the token

    def log(self) -> str:
        return self.log_path.read_text()

    def listening(self) -> bool:
        """Whether it answers HTTP at all (any answer: GET / itself would start the notebook's kernel)."""
        try:
            urllib.request.urlopen(f"{self.url}api/kernels", timeout=2).read()
        except urllib.error.HTTPError:
            return True
        except OSError:
            return False
        return True

    def wait_for(self, pattern: str | re.Pattern, timeout_s: float, ready=lambda: True) -> re.Match:
        """The first match of ``pattern`` in its log, once there and ``ready()``; the test fails if the app exits
        first or ``timeout_s`` pass."""
        deadline = time.monotonic() + timeout_s
        while not ((found := re.search(pattern, self.log())) and ready()):
            if self.process.poll() is not None:
                pytest.fail(f"kvlab app exited with {self.process.returncode}:\n{self.log()[-3000:]}")
            if time.monotonic() > deadline:
                pytest.fail(f"kvlab app: {pattern!r} not in its log (or not answering) in {timeout_s} s:\n"
                            f"{self.log()[-3000:]}")
            time.sleep(0.25)
        return found


@contextlib.contextmanager
def kvlab_app(tmp_path: Path, notebook: str, *flags: str) -> Iterator[KvlabApp]:
    """``python -m kvlab.cli app <notebook> --port <free port> --no-browser <flags>`` (this checkout's kvlab, Jupyter's
    runtime files under ``tmp_path``), its output in ``tmp_path/app.log``; stopped with SIGINT when the block ends
    (killed after 60 s). The caller checks ``process.returncode`` and the log after the block."""
    port = free_port()
    log_path = tmp_path / "app.log"
    env = {**os.environ, "PYTHONPATH": str(REPO), "JUPYTER_PLATFORM_DIRS": "1",
           "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
    with log_path.open("wb") as out:
        process = subprocess.Popen([sys.executable, "-m", "kvlab.cli", "app", notebook, "--port", str(port),
                                    "--no-browser", *flags], env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        yield KvlabApp(process, log_path, f"http://127.0.0.1:{port}/")
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


# -- JupyterLab through window.jupyterapp -----------------------------------------------------------

# The notebook panel for a path (or the current widget). Needs --LabApp.expose_app_in_browser=True.
_FIND_PANEL = """
const findPanel = (path) => {
  const app = window.jupyterapp;
  if (!app || !app.shell) return null;
  if (path === null) return app.shell.currentWidget;
  for (const w of app.shell.widgets('main')) {
    if (w.context && w.context.path === path) return w;
  }
  return null;
};
"""

_KERNEL_IDLE = _FIND_PANEL + """
(path) => {
  const panel = findPanel(path);
  if (!panel || !panel.sessionContext || !panel.context || !panel.context.isReady) return false;
  const kernel = panel.sessionContext.session && panel.sessionContext.session.kernel;
  return !!kernel && kernel.status === 'idle' && kernel.connectionStatus === 'connected';
}
"""


def wait_kernel_idle(page: Page, path: str | None = None, timeout: float = 120_000) -> None:
    """Wait until the notebook at ``path`` (default: the current tab) has a connected, idle kernel."""
    page.wait_for_function(_KERNEL_IDLE, arg=path, timeout=timeout, polling=100)


def open_notebook(page: Page, server: LabServer, relpath: str, timeout: float = 120_000) -> None:
    """Open ``relpath`` (relative to the Lab root) in a reset workspace and wait for an idle kernel.

    Deletes the notebook's old sessions first: reconnecting to an old kernel replays every widget it ever
    made (docs/testing.md#browser-tests).
    """
    relpath = Path(relpath).as_posix()
    if not (server.root_dir / relpath).is_file():
        raise FileNotFoundError(server.root_dir / relpath)
    server.delete_sessions(relpath)
    page.goto(f"{server.url}/lab/tree/{quote(relpath)}?reset", wait_until="domcontentloaded")
    wait_kernel_idle(page, relpath, timeout)


def open_file_browser(page: Page, timeout: float = 30_000) -> float:
    """Open JupyterLab's left side panel on the file browser (as a workshop attendee has it) and return its width
    in pixels once it is shown; the notebook is laid out again beside it."""
    page.evaluate("() => window.jupyterapp.shell.activateById('filebrowser')")
    page.wait_for_function(
        "() => { const fb = document.querySelector('#filebrowser');"
        " return !!fb && fb.getClientRects().length > 0 && fb.getBoundingClientRect().width > 100; }",
        timeout=timeout, polling=100)
    page.wait_for_timeout(300)  # the notebook panel follows the new width
    return page.evaluate("() => document.querySelector('#filebrowser').getBoundingClientRect().width")


def run_all(page: Page, timeout: float = 300_000, path: str | None = None) -> None:
    """Run all cells of the current notebook and wait until every cell finished and the kernel is idle.

    Raises AssertionError (with the error outputs shown in the page) when a cell fails.
    """
    page.evaluate(
        """() => {
          const state = window.__kvlabRunAll = {done: false, ok: null, error: null};
          window.jupyterapp.commands.execute('notebook:run-all-cells')
            .then(ok => { state.ok = ok; state.done = true; })
            .catch(e => { state.error = String(e); state.done = true; });
        }"""
    )
    page.wait_for_function("() => window.__kvlabRunAll.done", timeout=timeout, polling=200)
    state = page.evaluate("() => window.__kvlabRunAll")
    if state["error"] is not None or state["ok"] is False:
        errors = page.locator('.jp-OutputArea-output[data-mime-type="application/vnd.jupyter.stderr"]')
        shown = "\n---\n".join(errors.all_inner_texts())
        raise AssertionError(f"run-all failed ({state['error'] or 'a cell raised'}):\n{shown}")
    wait_kernel_idle(page, path, timeout)


def wait_for_output_text(page: Page, text: str, timeout: float = 120_000) -> str:
    """Wait for a cell *output* (not cell source) containing ``text``; returns that output's text."""
    output = page.locator(".jp-OutputArea-output", has_text=text).first
    output.wait_for(state="visible", timeout=timeout)
    return output.inner_text()


# -- plotly -------------------------------------------------------------------------------------

# gd.data as plain JSON: typed arrays become lists and plotly's base64 specs ({dtype, bdata, shape}),
# which plotly.py >= 6 sends for numpy arrays, are decoded.
_PLOTLY_DATA = """
const plotlyData = (root) => {
  if (!root) return null;
  const gd = root.classList.contains('js-plotly-plot') ? root : root.querySelector('.js-plotly-plot');
  if (!gd || !Array.isArray(gd.data)) return null;
  const TYPES = {f8: Float64Array, f4: Float32Array, i4: Int32Array, u4: Uint32Array, i2: Int16Array,
                 u2: Uint16Array, i1: Int8Array, u1: Uint8Array, u1c: Uint8ClampedArray,
                 float64: Float64Array, float32: Float32Array, int32: Int32Array, uint32: Uint32Array,
                 int16: Int16Array, uint16: Uint16Array, int8: Int8Array, uint8: Uint8Array,
                 uint8c: Uint8ClampedArray};
  const decode = (spec) => {
    const T = TYPES[spec.dtype];
    const bin = atob(spec.bdata);
    const bytes = new Uint8Array(bin.length);
    for (let i = 0; i < bin.length; i++) bytes[i] = bin.charCodeAt(i);
    const flat = Array.from(new T(bytes.buffer));
    const shape = typeof spec.shape === 'string' ? spec.shape.split(',').map(Number) : spec.shape;
    if (!shape || shape.length < 2) return flat;
    const [rows, cols] = shape;
    return Array.from({length: rows}, (_, r) => flat.slice(r * cols, (r + 1) * cols));
  };
  const plain = (v) => {
    if (v === null || v === undefined) return v;
    if (ArrayBuffer.isView(v)) return Array.from(v);
    if (Array.isArray(v)) return v.map(plain);
    if (typeof v === 'function') return undefined;
    if (typeof v === 'object') {
      if (typeof v.bdata === 'string' && typeof v.dtype === 'string' && v.dtype in TYPES) return decode(v);
      const out = {};
      for (const [k, x] of Object.entries(v)) { if (!k.startsWith('_')) out[k] = plain(x); }
      return out;
    }
    return v;
  };
  return gd.data.map(plain);
};
"""


def _plot_root(page: Page, selector: str) -> Locator:
    return page.locator(selector)


def plotly_data(page: Page, selector: str) -> list[dict]:
    """The traces (``gd.data``: x, y, name, type, ...) of the ``.js-plotly-plot`` in/at ``selector``.

    Raises LookupError if the plot has not rendered yet (use ``wait_plotly`` first).
    """
    data = _plot_root(page, selector).evaluate("(root) => {" + _PLOTLY_DATA + "return plotlyData(root); }")
    if data is None:
        raise LookupError(f"no rendered .js-plotly-plot in {selector!r}")
    return data


def wait_plotly(page: Page, selector: str, timeout: float = 90_000) -> list[dict]:
    """Wait until the plot in ``selector`` has rendered traces; returns ``plotly_data``.

    A plotly FigureWidget takes 14-18 s to appear on 2 cores; a kvlab LiveFigure a few seconds.
    """
    _plot_root(page, selector).wait_for(state="attached", timeout=timeout)
    page.wait_for_function(
        "(selector) => {" + _PLOTLY_DATA + "const d = plotlyData(document.querySelector(selector));"
        " return d !== null && d.length > 0; }",
        arg=selector, timeout=timeout, polling=100,
    )
    return plotly_data(page, selector)


def plotly_axes(page: Page, selector: str) -> dict[str, list]:
    """The drawn axis ranges of the plot in ``selector`` (``gd._fullLayout``): {"xaxis": [lo, hi], ...}.

    An empty figure draws its axes at plotly's default [-1, 1] (or [-1, 6] for categories)."""
    return _plot_root(page, selector).evaluate(
        """(root) => {
          const gd = root.classList.contains('js-plotly-plot') ? root : root.querySelector('.js-plotly-plot');
          const out = {};
          for (const [k, v] of Object.entries(gd._fullLayout)) {
            if (/^[xy]axis\\d*$/.test(k) && v && Array.isArray(v.range)) out[k] = v.range.slice();
          }
          return out;
        }""")


def plotly_title(page: Page, selector: str) -> str:
    """The drawn title text of the plot in ``selector`` (from ``gd._fullLayout``)."""
    return _plot_root(page, selector).evaluate(
        "(root) => { const gd = root.classList.contains('js-plotly-plot') ? root : root.querySelector('.js-plotly-plot');"
        " const t = gd._fullLayout.title; return (t && t.text) || ''; }")


def wait_plotly_change(page: Page, selector: str, old_data: list[dict], timeout: float = 30_000) -> list[dict]:
    """Wait until ``plotly_data(page, selector)`` differs from ``old_data``; returns the new data."""
    page.wait_for_function(
        "([selector, old]) => {" + _PLOTLY_DATA + "const d = plotlyData(document.querySelector(selector));"
        " return d !== null && JSON.stringify(d) !== old; }",
        arg=[selector, json.dumps(old_data, separators=(",", ":"), ensure_ascii=False)], timeout=timeout, polling=100,
    )
    return plotly_data(page, selector)


# -- ipywidgets, located by CSS class -------------------------------------------------------------

def widget(page: Page, css_class: str) -> Locator:
    """The element of the widget given ``add_class(css_class)`` (strict: exactly one must match)."""
    return page.locator(f".{css_class.lstrip('.')}")


def click_widget(page: Page, css_class: str) -> None:
    """Click a Button/ToggleButton (or the first button inside a widget with that class)."""
    el = widget(page, css_class)
    if not el.evaluate("e => e.matches('button, [role=button], input')"):
        el = el.locator("button").first
    el.click()


def check_widget(page: Page, css_class: str, checked: bool = True, timeout: float = 10_000) -> None:
    """Set a Checkbox or ToggleButton to ``checked`` (no-op if it already is)."""
    el = widget(page, css_class)
    box = el.locator("input[type=checkbox]")
    if box.count():
        box.set_checked(checked, timeout=timeout)
        return
    is_active = "e => e.classList.contains('mod-active')"  # ipywidgets' ToggleButton "pressed" class
    if el.evaluate(is_active) != checked:
        el.click(timeout=timeout)
    page.wait_for_function(
        "([sel, want]) => document.querySelector(sel).classList.contains('mod-active') === want",
        arg=[f".{css_class.lstrip('.')}", checked], timeout=timeout,
    )


def set_slider(page: Page, css_class: str, value: float, timeout: float = 10_000) -> str:
    """Type ``value`` into a single-valued slider's readout (needs ``readout=True``); returns the new readout.

    The readout is ipywidgets' contenteditable box; Enter commits, and the value is clamped to the range
    and rounded to ``step`` by the widget, as for a user.
    """
    readout = widget(page, css_class).locator(".widget-readout")
    readout.click(timeout=timeout)
    page.keyboard.press("ControlOrMeta+a")
    page.keyboard.type(str(value))
    page.keyboard.press("Enter")
    return readout.inner_text(timeout=timeout).strip()


def select_dropdown(page: Page, css_class: str, label: str, timeout: float = 10_000) -> None:
    """Pick the option shown as ``label`` in a Dropdown/Select (or ToggleButtons, RadioButtons)."""
    el = widget(page, css_class)
    select = el.locator("select")
    if select.count():
        select.select_option(label=label, timeout=timeout)
        return
    radio = el.get_by_label(label, exact=True)
    if radio.count():
        radio.check(timeout=timeout)
        return
    el.get_by_role("button", name=label, exact=True).click(timeout=timeout)


def table_text(page: Page, css_class: str) -> str:
    """Visible text of the table inside the widget (e.g. an HTML summary), or of the widget itself."""
    el = widget(page, css_class)
    table = el.locator("table")
    return (table.first if table.count() else el).inner_text()


def wait_widget_text(page: Page, css_class: str, text: str, timeout: float = 30_000) -> str:
    """Wait until the widget's text contains ``text`` (widgets update asynchronously); returns its text."""
    el = widget(page, css_class)
    expect(el).to_contain_text(text, timeout=timeout)
    return el.inner_text()


def table_rows(page: Page, css_class: str) -> list[list[str]]:
    """The first table inside the widget as rows of trimmed cell texts (header row included)."""
    return widget(page, css_class).locator("table").first.evaluate(
        "t => Array.from(t.rows, r => Array.from(r.cells, c => c.textContent.trim()))"
    )


def table_cells(page: Page, css_class: str) -> list[dict[str, str]]:
    """Every ``<td data-field=...>`` of the table inside the widget as its data-* attributes (``field``,
    ``value`` and the column's ``arm`` / ``mode``): the numbers behind what the table shows."""
    return widget(page, css_class).locator("td[data-field]").evaluate_all(
        "tds => tds.map(td => Object.assign({}, td.dataset))")


def screenshot(page: Page, path: str | os.PathLike[str], selector: str | None = None) -> Path:
    """Save a PNG of ``selector`` (e.g. ".kvlab-pool-fig") or of the page; returns the path.

    The notebook scrolls inside its own panel, so a page shot shows only what is on screen: pass a
    selector to capture a widget wherever it is (Playwright scrolls it into view). An element taller
    than the window is shot in a window made tall enough for it, then the window is set back.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if selector is None:
        page.screenshot(path=path, full_page=True)
        return path
    element = page.locator(selector)
    size = page.viewport_size
    box = element.bounding_box()
    if size and box and box["height"] + 200 > size["height"]:
        page.set_viewport_size({"width": size["width"], "height": int(box["height"]) + 400})
        try:
            page.wait_for_timeout(300)  # let the page lay out again at the new height
            element.screenshot(path=path)
        finally:
            page.set_viewport_size(size)
    else:
        element.screenshot(path=path)
    return path


# -- latency ------------------------------------------------------------------------------------

def timed_plot_change(page: Page, plot_selector: str, control_selector: str, action: str = "click",
                      value: str | None = None, timeout_ms: float = 30_000) -> float:
    """Operate a control in the page and return the milliseconds until the plot's data changed.

    All in one ``evaluate``: the clock starts right before the DOM event and is read on the first
    animation frame whose ``gd.data`` differs, so neither Playwright's round trips nor a polling
    interval is counted. ``action``: ``"click"`` (the control's checkbox, or the element itself) or
    ``"select"`` (a Dropdown's <select>, set to the option labelled ``value``) or ``"button"``
    (the ToggleButtons button labelled ``value``). Raises TimeoutError
    if the plot did not change within ``timeout_ms``.
    """
    elapsed = page.evaluate(
        "async ([plotSel, controlSel, action, value, limit]) => {" + _PLOTLY_DATA + """
          const gd = document.querySelector(plotSel);
          const old = JSON.stringify(plotlyData(gd));
          const control = document.querySelector(controlSel);
          const t0 = performance.now();
          if (action === 'select') {
            const select = control.querySelector('select');
            const option = Array.from(select.options).find(o => o.textContent.trim() === value);
            if (!option) throw new Error('no option ' + value);
            select.value = option.value;
            select.dispatchEvent(new Event('change', {bubbles: true}));
          } else if (action === 'button') {
            const button = Array.from(control.querySelectorAll('button')).find(b => b.textContent.trim() === value);
            if (!button) throw new Error('no button ' + value);
            button.click();
          } else {
            (control.querySelector('input[type=checkbox]') || control).click();
          }
          while (performance.now() - t0 < limit) {
            await new Promise(r => requestAnimationFrame(r));
            if (JSON.stringify(plotlyData(document.querySelector(plotSel))) !== old) return performance.now() - t0;
          }
          return null;
        }""",
        [plot_selector, control_selector, action, value, timeout_ms],
    )
    if elapsed is None:
        raise TimeoutError(f"{plot_selector} did not change within {timeout_ms} ms of operating {control_selector}")
    return float(elapsed)


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * q // 100))
    return ordered[int(rank) - 1]
