"""``kvlab app``: one notebook as a Voila dashboard, for projector demos.

Voila runs the notebook in a fresh kernel and shows only outputs (``--strip_sources=True``: code hidden) with
live widgets, so the panels of notebooks 01/02 work as in JupyterLab. It listens on 127.0.0.1 unless ``ip``
(``--ip``) says otherwise: a demo laptop on a conference network should not serve a kernel to the room unasked;
``--ip 0.0.0.0`` serves a room, with the token kept and the URL attendees open printed (:func:`room_urls`).

Who may open it: a page runs code, so other users of the machine must not reach it. ``kvlab app`` makes a
random token (Voila's ``--Voila.token``, jupyter_server's token login) and prints the URL that carries it; a
request without it gets 403 and starts no kernel. The token travels to Voila in its environment, never on a
command line (``/proc/<pid>/cmdline`` is world-readable; see :mod:`kvlab.app_server`). ``--no-token`` turns it
off. At most ``max_kernels`` kernels run at once (:class:`kvlab.app_server.CappedKernelManager`; a page beyond
that gets HTTP 503), and tracebacks reach the page only with ``show_tracebacks`` (``--show-tracebacks``): a
viewer sees that a cell failed, not the code and paths around it.

Every page load starts a kernel. Voila shuts it down when the page says goodbye (``beforeunload``); a page
that never does (a crashed tab, a laptop lid closed, a dropped connection) leaves a kernel with no connection,
which Voila culls once it has been idle for ``cull_idle_seconds`` (default 10 minutes). A kernel with an open
page is never culled, however long the audience stares at it.

Stopping: Voila runs in a session of its own, so the terminal's Ctrl-C reaches ``kvlab app`` only, and
``kvlab app`` owns the shutdown. On SIGINT, SIGTERM or SIGHUP (a closed terminal) it asks Voila to stop (SIGTERM, which Voila handles by
shutting its kernels down), waits up to ``stop_timeout`` seconds, then kills Voila's process group and any
kernel Voila left behind. A second Ctrl-C skips the wait. Kernels are found as Voila's descendants in
``/proc`` (Linux); elsewhere only Voila's own shutdown and ipykernel's parent watch stop them. A ``kvlab app``
killed outright (SIGKILL) cannot do any of that: Voila then gets SIGTERM from the kernel (a parent-death signal,
:func:`kvlab.procs.die_with_parent`, Linux), shuts its kernels down and frees the port, and the Voila process
removes the dashboard copy's folder as it exits.

Panel first: Voila runs with progressive rendering (``VoilaConfiguration.progressive_rendering``): the page
arrives at once and each cell's outputs appear as the cell finishes, where plain Voila shows a spinner until the
whole notebook has run. Cells run in page order, so ``kvlab app`` serves a reordered copy
(:func:`dashboard_notebook`): the title, then the cells tagged ``dashboard`` (the live panel: a cell that runs on
its own, importing what it uses), then the rest of the notebook. The copy is written to a temporary folder that
``kvlab app`` deletes when it stops, under the notebook's name with control characters written as escapes (Voila
prints it). The notebook is read as ``kvlab report`` reads it (:func:`kvlab.notebook_exec.read_notebook`): a FIFO,
a device or a file without cells is refused by name before Voila starts. Voila serves that folder
(``Voila.root_dir``) while its kernel manager starts kernels in the notebook's own folder (``MappingKernelManager.root_dir``: Voila asks for a kernel at the
notebook's path relative to the root, and the kernel manager resolves that against its own root), so relative
paths in the notebook mean what they mean in JupyterLab.

Workshop mode (``pool_size`` > 0, ``kvlab app --workshop N``): Voila's own pre-heated kernels
(``VoilaConfiguration.preheat_kernel``, ``default_pool_size``) keep N kernels that have already run the whole
notebook; a page load takes one (its panel is on the page as soon as the HTML arrives) and Voila starts a
replacement in the background. Voila cannot pre-heat with progressive rendering, so that mode renders the page
whole. A kernel waiting in the pool is never culled (:class:`kvlab.app_server.CappedKernelManager`), and
``max_kernels`` still counts pages: the pool's waiting kernels come on top. ``solutions`` (``--solutions``)
sets ``KVLAB_SOLUTIONS=1`` for the kernels, so each exercise offers its solution on the page
(:mod:`kvlab.labs.solution`); every kernel ``kvlab app`` starts has ``KVLAB_APP=1``, so an exercise says that its
code is hidden on this page and where to change it.

Progress: the ``kvlab-app`` Voila template (``kvlab/app_share/voila/templates/kvlab-app``, found through
``JUPYTER_PATH``) replaces Voila's bare spinner by a line at the top of the page that names the notebook, says
that the panel comes first and counts the cells still running, and goes away when the last one is done.
"""

from __future__ import annotations

import contextlib
import copy
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvlab.errors import KvlabError
from kvlab.procs import MAX_WORKERS_ENV, die_with_parent
from kvlab.report import DEFAULT_NOTEBOOK_DIR, ReportError, select_notebooks
from kvlab.safe_text import printable

HOST = "127.0.0.1"
DEFAULT_CULL_IDLE_SECONDS = 600  # a kernel with no page connected goes after 10 idle minutes
STOP_TIMEOUT_S = 15.0  # Voila's own kernel shutdown usually takes a second or two
_KERNEL_KILL_WAIT_S = 5.0
DASHBOARD_TAG = "dashboard"  # cells shown first in `kvlab app` (the live panels)
PARAMETERS_TAG = "parameters"  # a notebook's settings cell (papermill's convention): runs before the panels
TEMPLATE = "kvlab-app"
SHARE_DIR = Path(__file__).resolve().parent / "app_share"  # holds voila/templates/kvlab-app, put on JUPYTER_PATH
MOVED_NOTE = "*(The live panel of this section is at the top of the page.)*"
SERVER_MODULE = "kvlab.app_server"  # runs Voila (and holds its kernel manager): see kvlab/app_server.py
PAGE_PLOTLY_ENV = "KVLAB_PAGE_PLOTLY"  # = kvlab.viz.live.PAGE_PLOTLY_ENV (kvlab.app does not import plotly)
PLOTLY_FILE = "kvlab-plotly.min.js"  # workshop mode: plotly.js served beside the dashboard copy (write_dashboard)
APP_ENV = "KVLAB_APP"  # = kvlab.labs.solution.APP_ENV: set for the kernels of `kvlab app`
APP_NOTEBOOK_ENV = "KVLAB_APP_NOTEBOOK"  # = kvlab.labs.solution.APP_NOTEBOOK_ENV: the notebook's number
TOKEN_ENV = "KVLAB_APP_TOKEN"  # = kvlab.app_server.TOKEN_ENV (that module imports nothing from kvlab, nor this from it)
DEFAULT_MAX_KERNELS = 8  # = kvlab.app_server.DEFAULT_MAX_KERNELS: pages open at once


class AppError(KvlabError, RuntimeError):
    """Unknown notebook or Voila missing."""


def find_notebook(key: str, notebook_dir: Path = DEFAULT_NOTEBOOK_DIR) -> Path:
    """``01`` or ``01_kv_pool_sizing`` -> notebooks/01_kv_pool_sizing.ipynb (exactly one match)."""
    notebook_dir = Path(notebook_dir).resolve()  # Voila runs with the notebook's folder as its cwd
    if not notebook_dir.is_dir():
        raise AppError(f"kvlab app --notebook-dir {notebook_dir}: not a directory")
    try:
        matches = select_notebooks(notebook_dir, [key])
    except ReportError as exc:
        raise AppError(str(exc).replace("--notebooks", "kvlab app")) from None
    if len(matches) != 1:
        raise AppError(f"kvlab app {key!r}: matches {len(matches)} notebooks: {', '.join(m.stem for m in matches)}")
    return matches[0]


def cull_interval(cull_idle_seconds: int) -> int:
    """How often Voila looks for idle kernels: half the idle timeout, between 1 s and a minute."""
    return max(1, min(60, cull_idle_seconds // 2))


def _tags(cell) -> list[str]:
    return list(cell.get("metadata", {}).get("tags", []))


def dashboard_notebook(nb):
    """A copy of ``nb`` in dashboard order: the title, the ``parameters`` cell (the settings the panel reads), the
    cells tagged ``dashboard``, then the rest in order.

    The title is the first cell's first line when that cell is markdown starting with a ``# `` heading (the rest
    of that cell stays where it was). Where a tagged cell was, a one-line note points to the top of the page.
    ``nb.metadata.kvlab_app`` records the title and how many cells were moved (the template shows them);
    ``nb.metadata.title`` names the browser tab. Without tagged cells the order is the notebook's own.
    """
    import nbformat

    nb = copy.deepcopy(nb)
    cells = list(nb.cells)
    title_cells, title = [], None
    if cells and cells[0].cell_type == "markdown" and DASHBOARD_TAG not in _tags(cells[0]):
        first_line, _, rest = cells[0].source.partition("\n")
        if first_line.startswith("# "):
            title = first_line[2:].strip()
            title_cells = [nbformat.v4.new_markdown_cell(first_line)]
            if rest.strip():
                cells[0].source = rest.strip("\n")
            else:
                cells = cells[1:]
    dashboard = [c for c in cells if DASHBOARD_TAG in _tags(c)]
    # The notebook's parameters cell (papermill's tag) goes first with the panel: the panel reads its settings.
    parameters = [c for c in cells if PARAMETERS_TAG in _tags(c) and DASHBOARD_TAG not in _tags(c)] if dashboard else []
    rest = [nbformat.v4.new_markdown_cell(MOVED_NOTE) if DASHBOARD_TAG in _tags(c) else c for c in cells
            if not any(c is p for p in parameters)]
    nb.cells = title_cells + parameters + dashboard + rest if dashboard else title_cells + cells
    nb.metadata["kvlab_app"] = {"title": title, "dashboard_cells": len(dashboard)}
    if title:
        nb.metadata["title"] = title
    return nb


def read_dashboard_source(notebook: Path):
    """``notebook`` read as ``kvlab report`` reads it (:func:`kvlab.notebook_exec.read_notebook`: a FIFO, a device,
    a file without cells or nested too deep is refused by name), as an :class:`AppError`."""
    from kvlab.notebook_exec import NotebookFormatError, read_notebook

    try:
        return read_notebook(notebook)
    except NotebookFormatError as exc:
        raise AppError(f"kvlab app: {exc}") from None


def write_dashboard(notebook: Path, folder: Path, nb=None, *, page_plotly: bool = False) -> Path:
    """Write ``notebook`` (or ``nb``, already read from it) in dashboard order to ``folder``; returns the copy's
    path. The copy's name is the notebook's with control characters written as escapes
    (:func:`kvlab.safe_text.printable`): Voila prints it on the terminal.

    ``page_plotly`` (workshop mode): plotly.py's own plotly.min.js is copied beside it as :data:`PLOTLY_FILE`
    (Voila serves it, ``/voila/files/``) and ``nb.metadata.kvlab_app.page_plotly`` names it, so the page loads
    plotly.js once, as a file the browser fetches while Voila starts, and draws both the live figures and the
    static ones with it (see :func:`voila_command`)."""
    import nbformat

    page = Path(folder) / printable(notebook.name)
    nb = dashboard_notebook(nb if nb is not None else read_dashboard_source(notebook))
    if page_plotly:
        from kvlab.viz.plotly_js import plotly_js  # (plotly only in viz, and only in workshop mode)

        (Path(folder) / PLOTLY_FILE).write_text(plotly_js(), encoding="utf-8")
        nb.metadata["kvlab_app"]["page_plotly"] = PLOTLY_FILE
    nbformat.write(nb, page)
    return page


@contextlib.contextmanager
def dashboard_folder(notebook: Path, nb=None, *, page_plotly: bool = False) -> Iterator[Path]:
    """The dashboard copy of ``notebook`` (or of ``nb``, read from it) in a temporary folder (mode 0700), deleted
    on exit (if the Voila process has not removed it already); yields the copy's path."""
    folder = tempfile.mkdtemp(prefix="kvlab-app-")
    try:
        yield write_dashboard(notebook, Path(folder), nb, page_plotly=page_plotly)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def voila_command(notebook: Path, *, page: Path, port: int, open_browser: bool = False,
                  cull_idle_seconds: int = DEFAULT_CULL_IDLE_SECONDS, max_kernels: int = DEFAULT_MAX_KERNELS,
                  show_tracebacks: bool = False, pool_size: int = 0, ip: str = HOST) -> list[str]:
    """The Voila command line (``python -m kvlab.app_server``, Voila in this interpreter's environment) that
    serves ``page`` (the dashboard copy of ``notebook``, its folder removed when Voila exits) with kernels
    started in ``notebook``'s folder.

    ``cull_idle_seconds`` > 0: a kernel idle that long with no page connected is shut down (jupyter_server's
    culler, which Voila's kernel manager inherits); 0 never culls. ``max_kernels`` > 0: kernels at once (0 = no
    cap; pages, with a pool's waiting kernels on top). ``show_tracebacks``: a failing cell's traceback reaches the
    page. ``pool_size`` > 0: that many pre-heated kernels (workshop mode, see the module's docstring). ``ip``: the
    address Voila listens on. Kernels talk to Voila over IPC sockets (``KernelManager.transport=ipc``), not TCP:
    no kernel port on any interface, and no "running over TCP without encryption" warning per kernel. Run it with
    ``app_env``'s
    environment (the template is found through ``JUPYTER_PATH``; the token, if any, is there too).
    """
    if cull_idle_seconds < 0:
        raise AppError(f"kvlab app --cull-idle-seconds: must be >= 0 (0 = never), got {cull_idle_seconds}")
    if max_kernels < 0:
        raise AppError(f"kvlab app --max-kernels: must be >= 0 (0 = no cap), got {max_kernels}")
    if pool_size < 0:
        raise AppError(f"kvlab app --workshop: must be >= 0 pre-heated kernels (0 = off), got {pool_size}")
    cap = max_kernels + pool_size if max_kernels else 0
    cmd = [sys.executable, "-m", SERVER_MODULE, str(page.parent), str(page), f"--port={port}", f"--Voila.ip={ip}",
           "--KernelManager.transport=ipc",
           "--Voila.port_retries=0", "--strip_sources=True", f"--show_tracebacks={show_tracebacks}", "--theme=light",
           f"--VoilaConfiguration.multi_kernel_manager_class={SERVER_MODULE}.CappedKernelManager",
           f"--CappedKernelManager.max_kernels={cap}",
           f"--VoilaConfiguration.template={TEMPLATE}",
           f"--Voila.root_dir={page.parent}",
           f"--MappingKernelManager.root_dir={notebook.parent}",  # the kernel's cwd: the notebook's own folder
           f"--MappingKernelManager.cull_idle_timeout={cull_idle_seconds}",
           f"--MappingKernelManager.cull_interval={cull_interval(cull_idle_seconds)}",
           "--MappingKernelManager.cull_connected=False", "--MappingKernelManager.cull_busy=False"]
    if pool_size:  # pre-heated kernels (Voila renders the page whole: it cannot pre-heat progressively)
        cmd += ["--VoilaConfiguration.preheat_kernel=True", f"--VoilaConfiguration.default_pool_size={pool_size}",
                "--VoilaConfiguration.progressive_rendering=False",
                # the page draws plotly outputs with the plotly.js file beside the copy (write_dashboard's
                # page_plotly), after the live panel: jupyterlab-plotly's renderer would evaluate its own 4.8 MB
                # copy and draw every figure of the notebook before the widgets' websocket is even read
                # (and jupytext's, which fails to load on a Voila page anyway)
                "--VoilaConfiguration.extension_denylist=jupyterlab-plotly",
                "--VoilaConfiguration.extension_denylist=jupyterlab-jupytext",
                f"--VoilaConfiguration.file_allowlist={PLOTLY_FILE.replace('.', '[.]')}"]
    else:
        cmd.append("--VoilaConfiguration.progressive_rendering=True")
    if not open_browser:
        cmd.append("--no-browser")
    return cmd


def app_env(device: str | None, token: str | None = None, *, solutions: bool = False,
            page_plotly: bool = False, notebook: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env.pop(TOKEN_ENV, None)
    env[APP_ENV] = "1"
    number = notebook.name.partition("_")[0] if notebook is not None else ""
    if number.isdigit():  # "serve this page with kvlab app 02 --solutions" (kvlab.labs.solution.app_command)
        env[APP_NOTEBOOK_ENV] = number
    else:
        env.pop(APP_NOTEBOOK_ENV, None)
    if page_plotly:  # the page loads plotly.js itself (write_dashboard): kvlab.viz.live sends it on request only
        env[PAGE_PLOTLY_ENV] = "1"
    else:
        env.pop(PAGE_PLOTLY_ENV, None)
    if solutions:
        env["KVLAB_SOLUTIONS"] = "1"
    if token:
        env[TOKEN_ENV] = token
    env.setdefault("KVLAB_PROGRESS", "0")
    # every page is a kernel of its own: a notebook's process pool in each would only multiply the processes
    env.setdefault(MAX_WORKERS_ENV, "1")
    env["JUPYTER_PATH"] = os.pathsep.join(p for p in (str(SHARE_DIR), env.get("JUPYTER_PATH")) if p)
    if device:
        env["KVLAB_DEVICE"] = device
    return env


# -- processes ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Proc:
    """A process as /proc saw it; ``start`` (clock ticks since boot) tells it from a later one with its pid."""

    pid: int
    ppid: int
    start: int


def _read_proc(pid: int) -> _Proc | None:
    """``None`` if ``pid`` is gone, a zombie, or there is no /proc."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode("ascii", "replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()  # the command name may hold spaces and parentheses
    if fields[0] in ("Z", "X"):
        return None
    return _Proc(pid, int(fields[1]), int(fields[19]))


def descendants(pid: int) -> list[_Proc]:
    """Every live process below ``pid`` (children first), from /proc; ``[]`` where there is no /proc."""
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []
    children: dict[int, list[_Proc]] = {}
    for p in pids:
        proc = _read_proc(p)
        if proc is not None:
            children.setdefault(proc.ppid, []).append(proc)
    found: list[_Proc] = []
    frontier = [pid]
    while frontier:
        below = [c for p in frontier for c in children.get(p, [])]
        found += below
        frontier = [c.pid for c in below]
    return found


def _alive(proc: _Proc) -> bool:
    now = _read_proc(proc.pid)
    return now is not None and now.start == proc.start


def _kill_leftovers(procs: list[_Proc]) -> int:
    """SIGTERM, then SIGKILL, each process of ``procs`` still alive (same pid and start time); how many."""
    left = [p for p in procs if _alive(p)]
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for p in left:
            try:
                os.kill(p.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + _KERNEL_KILL_WAIT_S
        while any(_alive(p) for p in left) and time.monotonic() < deadline:
            time.sleep(0.05)
        if not any(_alive(p) for p in left):
            break
    return len(left)


class _StopRequests:
    """SIGINT/SIGTERM/SIGHUP handler for the supervising loop: only records the signal (the loop acts on it)."""

    def __init__(self) -> None:
        self.signals: list[int] = []
        self._previous: dict[int, object] = {}

    def __enter__(self) -> _StopRequests:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
                self._previous[sig] = signal.signal(sig, self._record)
        return self

    def __exit__(self, *exc: object) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _record(self, signum: int, frame: object) -> None:
        self.signals.append(signum)


def _supervise(process: subprocess.Popen, stops: _StopRequests, stop_timeout: float) -> int:
    """Wait for Voila; on a stop request shut it and its kernels down. Returns ``kvlab app``'s exit status."""
    while process.poll() is None and not stops.signals:
        time.sleep(0.1)
    if not stops.signals:  # Voila ended on its own (it could not start, or someone signalled it directly)
        status = process.returncode if process.returncode >= 0 else 128 - process.returncode
        print(f"kvlab app: Voila exited on its own (status {status})", file=sys.stderr, flush=True)
        return status
    why = signal.Signals(stops.signals[0]).name
    kernels = descendants(process.pid)  # before Voila goes: afterwards its orphans have another parent
    try:
        process.send_signal(signal.SIGTERM)  # Voila's handler stops the server and shuts every kernel down
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + stop_timeout
    while process.poll() is None and time.monotonic() < deadline and len(stops.signals) < 2:
        time.sleep(0.05)
    forced = process.poll() is None
    if forced:
        try:
            os.killpg(process.pid, signal.SIGKILL)  # Voila leads its own group (start_new_session)
        except ProcessLookupError:
            pass
        process.wait()
    leftover = _kill_leftovers(kernels)
    n_kernels = sum(1 for k in kernels if k.ppid == process.pid)
    if forced:
        waited = "a second signal came" if len(stops.signals) > 1 else f"it did not stop within {stop_timeout:g} s"
        print(f"kvlab app: stopped ({why}); killed Voila ({waited}) and {leftover} leftover kernel process(es)",
              file=sys.stderr, flush=True)
        return 1
    if leftover:
        print(f"kvlab app: stopped ({why}); Voila stopped but left {leftover} kernel process(es), killed them",
              file=sys.stderr, flush=True)
        return 1
    print(f"kvlab app: stopped ({why}); Voila and its {n_kernels} kernel(s) shut down", flush=True)
    return 0


def _loopback(ip: str) -> bool:
    import ipaddress

    return ipaddress.ip_address(ip).is_loopback


def _wildcard(ip: str) -> bool:
    return ip in ("0.0.0.0", "::")


def _connect_host(ip: str) -> str:
    """Where this machine reaches a server listening on ``ip``."""
    return ("::1" if ":" in ip else HOST) if _wildcard(ip) else ip


def lan_address() -> str:
    """This machine's address on its network (the interface of its default route; no packet is sent), or the
    host name's address, or 127.0.0.1 when it has none."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("198.51.100.1", 9))  # TEST-NET-2: only the route is looked up
            address = probe.getsockname()[0]
        except OSError:
            address = ""
    if not address or address.startswith(("127.", "0.")):
        try:
            address = socket.gethostbyname(socket.gethostname())
        except OSError:
            address = HOST
    return address


def room_urls(ip: str, port: int, token: str | None) -> tuple[str, str]:
    """(the URL to give others, the URL for this machine), each with the token. Bound to every interface
    (``0.0.0.0``/``::``), others use this machine's LAN address (:func:`lan_address`); bound to one address,
    that address; on loopback both are the loopback URL."""
    query = f"?token={token}" if token else ""
    host = lan_address() if _wildcard(ip) else ip
    return f"http://{_bracket(host)}:{port}/{query}", f"http://{_bracket(_connect_host(ip))}:{port}/{query}"


def _bracket(host: str) -> str:
    return f"[{host}]" if ":" in host else host


def check_listen(ip: str, port: int) -> None:
    """An :class:`AppError` naming ``--ip``/``--port`` when this machine cannot listen there (an address it does
    not have, a port in use), before Voila starts and says so in a traceback."""
    import socket

    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((ip, port))
        except OSError as exc:
            raise AppError(f"kvlab app --ip {ip} --port {port}: cannot listen there: {exc.strerror}") from None


def _print_startup_notes(ip: str, url: str, local: str, pool_size: int) -> None:
    """What the instructor needs to know once, instead of Voila's per-page log lines."""
    if not _loopback(ip):
        print(f"kvlab app: attendees open {url} (this machine: {local})", flush=True)
        print("kvlab app: warning: plain HTTP, not encrypted: anyone on this network can read the token and the "
              "pages; for TLS put a reverse proxy in front (README.md, Workshop: caddy or nginx)", file=sys.stderr,
              flush=True)
    print("kvlab app: Voila's \"Notebook ... is not trusted\" is not shown: the page's copy of the notebook is "
          "unsigned, and Voila runs it afresh and shows only that run's outputs", flush=True)
    if pool_size:
        print(f"kvlab app: \"pool warm: {pool_size} kernel(s) ready\" below says the pre-heated kernels have run the "
              "notebook: pages open at once from then on", flush=True)


def _open_when_listening(url: str, port: int, process: subprocess.Popen, timeout_s: float = 120.0,
                         host: str = HOST) -> None:
    """Open ``url`` (with its token) in the web browser once Voila accepts connections on ``port``."""
    import socket
    import webbrowser

    deadline = time.monotonic() + timeout_s
    while process.poll() is None and time.monotonic() < deadline:
        try:
            socket.create_connection((host, port), timeout=1).close()
        except OSError:
            time.sleep(0.2)
            continue
        webbrowser.open(url)
        return


def serve(key: str, *, port: int = 8866, device: str | None = None, open_browser: bool = True,
          cull_idle_seconds: int = DEFAULT_CULL_IDLE_SECONDS, notebook_dir: Path = DEFAULT_NOTEBOOK_DIR,
          stop_timeout: float = STOP_TIMEOUT_S, token: bool = True, max_kernels: int = DEFAULT_MAX_KERNELS,
          show_tracebacks: bool = False, solutions: bool = False, pool_size: int = 0, ip: str = HOST) -> int:
    """Run Voila until SIGINT/SIGTERM/SIGHUP, then stop it and its kernels; returns the exit status.

    ``token``: a page needs the random token in the printed URL (``False``: anyone who can reach the port).
    ``solutions``: exercises offer their solutions. ``pool_size``: pre-heated kernels (workshop mode). ``ip``: the
    address to listen on (:func:`room_urls`: the URL printed is the one attendees open).
    0: stopped on request and everything shut down cleanly; 1: stopped, but Voila or a kernel had to be
    killed; Voila's own status (128 + signal if a signal ended it) when it exited without being asked.
    """
    try:
        import voila  # noqa: F401
    except ImportError:
        raise AppError("voila is not installed: pip install voila (or pip install -e .)") from None
    notebook = find_notebook(key, notebook_dir)
    check_listen(ip, port)
    nb = read_dashboard_source(notebook)  # before any handler or folder: a FIFO or a broken file is refused now
    with _StopRequests() as stops, dashboard_folder(notebook, nb, page_plotly=pool_size > 0) as page:  # handler first: no signal is lost
        # kvlab opens the browser itself: Voila's own launcher opens the URL without the token (a login page)
        cmd = voila_command(notebook, page=page, port=port, open_browser=False,
                            cull_idle_seconds=cull_idle_seconds, max_kernels=max_kernels,
                            show_tracebacks=show_tracebacks, pool_size=pool_size, ip=ip)
        secret = secrets.token_urlsafe(24) if token else None
        url, local = room_urls(ip, port, secret)
        print(f"kvlab app: serving {printable(notebook.name)} at {url} (Ctrl-C to stop)", flush=True)
        _print_startup_notes(ip, url, local, pool_size)
        if pool_size:
            print(f"kvlab app: workshop mode: {pool_size} pre-heated kernel(s) run the notebook now; a page load "
                  f"takes one and another starts{'; solutions shown' if solutions else ''}", flush=True)
        if not secret:
            who = "every user of this machine" if _loopback(ip) else "anyone who can reach this machine"
            print(f"kvlab app: warning: --no-token: {who} can open port {port} and run code as you",
                  file=sys.stderr, flush=True)
        parent = os.getpid()
        env = app_env(device, secret, solutions=solutions, page_plotly=pool_size > 0, notebook=notebook)
        process = subprocess.Popen(cmd, cwd=notebook.parent, env=env,
                                   start_new_session=True,
                                   preexec_fn=lambda: die_with_parent(parent, signal.SIGTERM))
        if open_browser:
            threading.Thread(target=_open_when_listening, args=(local, port, process, 120.0, _connect_host(ip)),
                             daemon=True).start()
        try:
            return _supervise(process, stops, stop_timeout)
        finally:
            if process.poll() is None:  # an exception in the loop: leave nothing behind
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


__all__ = ["APP_ENV", "AppError", "DASHBOARD_TAG", "PARAMETERS_TAG", "DEFAULT_CULL_IDLE_SECONDS", "DEFAULT_MAX_KERNELS", "HOST",
           "STOP_TIMEOUT_S", "TOKEN_ENV", "app_env",
           "cull_interval", "dashboard_folder", "dashboard_notebook", "descendants", "find_notebook", "serve",
           "voila_command", "write_dashboard"]
