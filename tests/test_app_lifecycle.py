"""``kvlab app`` stops cleanly and does not hoard kernels.

The real CLI (``python -m kvlab.cli app``) serves tests/fixtures/smoke.ipynb through ``--notebook-dir`` (a few
seconds to run, where notebook 01 takes ~20 s; the lifecycle does not depend on the notebook). An HTTP GET of
the page starts a kernel; with progressive rendering the page's script then asks Voila to run the cells over a
websocket (``/voila/execution/<kernel id>``) and receives each cell's outputs as it finishes. ``load_page`` does
what that script does, without a browser; a client that then goes away (no kernel websocket) is what a closed
tab or a sleeping laptop leaves behind. Processes are read from /proc, independently of kvlab.app's own
process walk.
"""

from __future__ import annotations

import asyncio
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
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
DEVICE = "cpu"  # the smoke notebook echoes KVLAB_DEVICE into its page

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process checks read /proc (Linux)"),
]


def _run_in_own_thread(call: Callable[[], object]) -> object:
    """``call()`` in a thread of its own: a browser test earlier in the session (Playwright's sync API) leaves
    an event loop on the main thread, where ``asyncio.run`` refuses to start another."""
    import concurrent.futures

    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(call).result()


@dataclass(frozen=True)
class Proc:
    pid: int
    ppid: int
    start: int
    cmdline: str


def _proc(pid: int) -> Proc | None:
    """The live process ``pid`` (``None`` if gone or a zombie)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return None
    fields = stat[stat.rfind(")") + 2:].split()
    if fields[0] in ("Z", "X"):
        return None
    return Proc(pid, int(fields[1]), int(fields[19]), cmdline)


def _tree(root: int) -> list[Proc]:
    procs = [p for p in (_proc(int(n)) for n in os.listdir("/proc") if n.isdigit()) if p is not None]
    found, frontier = [], {root}
    while frontier:
        below = [p for p in procs if p.ppid in frontier]
        found += below
        frontier = {p.pid for p in below}
    return found


def _alive(p: Proc) -> bool:
    now = _proc(p.pid)
    return now is not None and now.start == p.start


def _kernels(app_pid: int) -> list[Proc]:
    return [p for p in _tree(app_pid) if "ipykernel_launcher" in p.cmdline]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for(condition: Callable[[], bool], timeout: float, what: str, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not within {timeout:g} s\n--- kvlab app log ---\n{log.read_text()[-4000:]}")
        time.sleep(0.1)


@dataclass
class App:
    process: subprocess.Popen
    port: int
    log: Path

    @property
    def url(self) -> str:
        """The URL ``kvlab app`` printed: with its token (``?token=...``) unless started with ``--no-token``."""
        found = re.search(rf"serving \S+ at (http://127\.0\.0\.1:{self.port}/\S*) \(Ctrl-C to stop\)",
                          self.log.read_text())
        assert found, self.log.read_text()[-3000:]
        return found.group(1)

    @property
    def token_query(self) -> str:
        """``?token=...`` for the execution websocket (as the page's cookie would carry it), or nothing."""
        query = self.url.partition("?")[2]
        return f"?{query}" if query else ""

    def load_page(self, marker: str = f"kvlab-smoke-ready scale=1 device={DEVICE}") -> list[list[dict]]:
        """GET the dashboard (Voila starts a kernel), then run its cells as the page's script does; the last
        cell's output must carry ``marker`` (the smoke notebook's, by default). Returns the outputs per cell."""
        with urllib.request.urlopen(self.url, timeout=120) as response:
            page = response.read().decode()
        config = re.search(r'<script id="jupyter-config-data" type="application/json">(.*?)</script>', page, re.S)
        assert config, page[-2000:]
        kernel_id = json.loads(config.group(1))["kernelId"]
        ws = f"ws://127.0.0.1:{self.port}/voila/execution/{kernel_id}{self.token_query}"
        outputs = _run_in_own_thread(lambda: asyncio.run(_run_cells(ws, kernel_id)))
        assert marker in json.dumps(outputs[-1]), outputs[-1]
        return outputs

    def page_dir(self) -> Path:
        """The temporary folder Voila serves the dashboard copy from (its ``--Voila.root_dir``)."""
        root = re.search(r"--Voila\.root_dir=(\S+)", self.voila().cmdline)
        assert root, self.voila().cmdline
        return Path(root.group(1))

    def voila(self) -> Proc:
        children = [p for p in _tree(self.process.pid) if p.ppid == self.process.pid and " kvlab.app_server " in p.cmdline]
        assert len(children) == 1, children
        return children[0]

    def stop(self, sig: int, timeout: float = 60) -> str:
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"kvlab app still running {timeout:g} s after {sig!r}:\n{self.log.read_text()[-4000:]}")
        return self.log.read_text()


async def _run_cells(url: str, kernel_id: str, timeout: float = 120) -> list[list[dict]]:
    """Voila's progressive execution, as its page script drives it: open the execution websocket, ask it to
    execute, collect each cell's outputs until the last cell's result. Returns the outputs per cell."""
    from tornado.websocket import websocket_connect

    ws = await asyncio.wait_for(websocket_connect(url), timeout)
    try:
        hello = json.loads(await asyncio.wait_for(ws.read_message(), timeout))
        assert hello["action"] == "initialized", hello
        await ws.write_message(json.dumps({"action": "execute", "payload": {"kernel_id": kernel_id}}))
        cells: list[list[dict]] = []
        while True:
            message = await asyncio.wait_for(ws.read_message(), timeout)
            assert message is not None, "Voila closed the execution websocket before the last cell"
            reply = json.loads(message)
            assert reply["action"] == "execution_result", reply
            payload = reply["payload"]
            cells.append(payload["output_cell"].get("outputs", []))
            if payload["cell_index"] + 1 == payload["total_cell"]:
                return cells
    finally:
        ws.close()


def _listening(port: int) -> bool:
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/api/kernels", timeout=2).read()
    except urllib.error.HTTPError:
        return True  # any HTTP answer means it listens (GET / would start a kernel)
    except OSError:
        return False
    return True


def _port_is_free(port: int) -> bool:
    """Nothing listens: a new server can bind it (SO_REUSEADDR, as servers do: TIME_WAIT leftovers are no owner)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            s.listen()
        except OSError:
            return False
    return True


@pytest.fixture
def start_app(tmp_path: Path) -> Iterator[Callable[..., App]]:
    apps: list[App] = []

    def start(*extra: str, notebook: str = "smoke", notebook_dir: Path = FIXTURES, browser: str | None = None) -> App:
        """``browser``: a $BROWSER command line to open the page with (default: ``--no-browser``)."""
        port = _free_port()
        log = tmp_path / f"app-{port}.log"
        env = {**os.environ, "PYTHONPATH": str(REPO), "JUPYTER_PLATFORM_DIRS": "1",
               "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
        if browser:
            env["BROWSER"] = browser
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "kvlab.cli", "app", notebook, "--notebook-dir", str(notebook_dir),
                 "--port", str(port), *([] if browser else ["--no-browser"]), "--device", DEVICE, *extra],
                env=env, stdout=out, stderr=subprocess.STDOUT)
        app = App(process, port, log)
        apps.append(app)
        _wait_for(lambda: process.poll() is not None or _listening(port), 120, "Voila answering", log)
        assert process.poll() is None, f"kvlab app exited with {process.returncode}:\n{log.read_text()}"
        return app

    yield start
    for app in apps:  # a failed test must not leave servers or kernels behind
        if app.process.poll() is None:
            left = _tree(app.process.pid)
            app.process.kill()
            app.process.wait()
            for p in left:
                if _alive(p):
                    os.kill(p.pid, signal.SIGKILL)


def test_a_notebook_name_with_terminal_escapes_reaches_the_terminal_escaped(start_app, tmp_path: Path):
    """Voila logged the dashboard copy's name raw ("Notebook 01_ESC[2J… is not trusted" cleared the screen): the
    copy is named with its control characters written as escapes, as kvlab's own lines name it."""
    folder = tmp_path / "nbs"
    folder.mkdir()
    (folder / "01_\x1b[2Jsmoke.ipynb").write_bytes((FIXTURES / "smoke.ipynb").read_bytes())
    app = start_app(notebook="01", notebook_dir=folder)
    app.load_page()
    log = app.stop(signal.SIGTERM)
    assert app.process.returncode == 0, log
    assert "\x1b" not in log, [line for line in log.splitlines() if "\x1b" in line]
    assert "serving 01_\\x1b[2Jsmoke.ipynb at" in log


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=["SIGTERM", "SIGINT", "SIGHUP"])
def test_a_signal_stops_voila_and_every_kernel_and_frees_the_port(start_app, sig: signal.Signals):
    app = start_app()
    app.load_page()
    app.load_page()
    voila = app.voila()
    kernels = _kernels(app.process.pid)
    assert len(kernels) == 2, kernels  # one per page load
    assert all(k.ppid == voila.pid for k in kernels)
    # Voila serves the dashboard copy from a temporary folder; the kernels run in the notebook's own folder.
    page_dir = app.page_dir()
    assert (page_dir / "smoke.ipynb").is_file() and page_dir.resolve() != FIXTURES.resolve()
    assert {os.readlink(f"/proc/{k.pid}/cwd") for k in kernels} == {str(FIXTURES.resolve())}

    log = app.stop(sig)

    assert app.process.returncode == 0, log
    assert f"kvlab app: stopped ({sig.name}); Voila and its 2 kernel(s) shut down" in log
    assert not page_dir.exists(), f"kvlab app left its dashboard copy behind: {page_dir}"
    assert not _alive(voila), voila
    assert not [k for k in kernels if _alive(k)]
    assert _port_is_free(app.port)
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection(("127.0.0.1", app.port), timeout=2).close()


def test_a_voila_that_does_not_stop_is_killed_with_its_kernels(start_app):
    """A hung Voila (SIGSTOP: it cannot handle the SIGTERM) is killed when a second signal comes, and the
    kernels it leaves are killed too: the path a wedged server takes after the stop timeout."""
    app = start_app()
    app.load_page()
    voila = app.voila()
    page_dir = app.page_dir()
    kernels = _kernels(app.process.pid)
    assert len(kernels) == 1, kernels
    os.kill(voila.pid, signal.SIGSTOP)
    app.process.send_signal(signal.SIGTERM)
    time.sleep(0.5)

    log = app.stop(signal.SIGINT)

    assert app.process.returncode == 1, log
    assert re.search(r"kvlab app: stopped \(SIGTERM\); killed Voila \(a second signal came\) and \d leftover", log), log
    assert not _alive(voila)
    assert not [k for k in kernels if _alive(k)]
    assert _port_is_free(app.port)
    assert not page_dir.exists(), f"kvlab app left its dashboard copy behind: {page_dir}"


def test_the_kernel_of_a_page_gone_away_is_culled_while_the_app_runs(start_app):
    app = start_app("--cull-idle-seconds", "2")
    app.load_page()  # then the client goes away without a websocket: nothing keeps the kernel
    kernels = _kernels(app.process.pid)
    assert len(kernels) == 1, kernels
    _wait_for(lambda: not _alive(kernels[0]), 60, "idle kernel culled", app.log)
    assert app.process.poll() is None
    assert "Culling 'idle' kernel" in app.log.read_text()
    app.load_page()  # the app still serves: a new page gets a new kernel
    again = _kernels(app.process.pid)
    assert len(again) == 1 and again[0] != kernels[0]

    log = app.stop(signal.SIGTERM)
    assert app.process.returncode == 0, log
    assert not [k for k in again if _alive(k)]


def test_a_killed_app_leaves_no_voila_kernel_port_or_folder(start_app):
    """``kill -9`` of ``kvlab app`` gives it no chance to stop anything: Voila gets SIGTERM from its parent-death
    signal, shuts its kernel down, frees the port and removes the dashboard folder as it exits."""
    app = start_app()
    app.load_page()
    voila, page_dir = app.voila(), app.page_dir()
    kernels = _kernels(app.process.pid)
    assert len(kernels) == 1, kernels
    app.process.kill()
    app.process.wait(10)
    _wait_for(lambda: not _alive(voila) and not any(_alive(k) for k in kernels), 30, "Voila and its kernel gone",
              app.log)
    _wait_for(lambda: _port_is_free(app.port), 10, "port free", app.log)
    assert not page_dir.exists(), f"the dashboard copy was left behind: {page_dir}"


def _status(url: str) -> int:
    try:
        with urllib.request.urlopen(urllib.request.Request(url), timeout=120) as response:
            return response.status
    except urllib.error.HTTPError as exc:
        return exc.code


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_a_page_needs_the_token_and_the_token_is_not_on_a_command_line(start_app):
    """Without the printed URL's token a request gets no page and starts no kernel (jupyter_server's login); the
    token is in no process's command line (``/proc/<pid>/cmdline`` is world-readable), only in environments that
    this user alone can read."""
    app = start_app()
    token = app.url.partition("?token=")[2]
    assert len(token) >= 24, app.url
    opener = urllib.request.build_opener(_NoRedirect)
    for url in (f"http://127.0.0.1:{app.port}/", f"http://127.0.0.1:{app.port}/?token=wrong{token}",
                f"http://127.0.0.1:{app.port}/api/kernels"):
        try:
            status = opener.open(url, timeout=60).status
        except urllib.error.HTTPError as exc:
            status = exc.code
        assert status in (302, 403), (url, status)  # to the login form, or refused
    assert _kernels(app.process.pid) == []
    app.load_page()
    kernels = _kernels(app.process.pid)
    assert len(kernels) == 1
    voila = app.voila()
    for p in [voila, *kernels]:
        assert token not in p.cmdline
    for k in kernels:  # handed to Voila only (Voila itself puts the page's URL in a kernel's environment)
        assert b"KVLAB_APP_TOKEN=" not in Path(f"/proc/{k.pid}/environ").read_bytes()
    for p in [voila, *kernels]:  # where the token is in an environment, only this user can read it
        assert os.stat(f"/proc/{p.pid}/environ").st_mode & 0o077 == 0
    log = app.stop(signal.SIGTERM)
    assert app.process.returncode == 0, log


def test_the_browser_is_opened_at_the_url_with_its_token(start_app, tmp_path: Path):
    opened = tmp_path / "opened.txt"
    app = start_app(browser=f"{sys.executable} -c 'import sys, pathlib; pathlib.Path(sys.argv[2]).write_text(sys.argv[1])'"
                            f" %s {opened}")
    _wait_for(opened.exists, 60, "the browser opened", app.log)
    assert opened.read_text() == app.url and "?token=" in app.url
    log = app.stop(signal.SIGTERM)
    assert app.process.returncode == 0, log


def test_no_token_serves_anyone_and_says_so(start_app):
    app = start_app("--no-token")
    assert app.url == f"http://127.0.0.1:{app.port}/"
    assert "--no-token: every user of this machine can open" in app.log.read_text()
    app.load_page()
    log = app.stop(signal.SIGTERM)
    assert app.process.returncode == 0, log


def test_kernels_are_capped_and_tracebacks_hidden_unless_asked(start_app, tmp_path: Path):
    """``--max-kernels 1``: a second page gets HTTP 503 and no kernel. A failing cell shows the page that it failed,
    not its traceback (the code and paths around it), unless ``--show-tracebacks``."""
    import nbformat

    folder = tmp_path / "nbs"
    folder.mkdir()
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell("print('kvlab-before-the-error')"),
                nbformat.v4.new_code_cell("secret_local_name = 1\nraise ValueError('kvlab-hidden-detail')")]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, folder / "01_fails.ipynb")
    app = start_app("--max-kernels", "1", notebook="01", notebook_dir=folder)
    outputs = app.load_page(marker="")
    assert "kvlab-before-the-error" in json.dumps(outputs[0])
    assert "kvlab-hidden-detail" not in json.dumps(outputs) and "secret_local_name" not in json.dumps(outputs)
    assert _status(app.url) == 503 and len(_kernels(app.process.pid)) == 1
    assert "the --max-kernels cap" in app.log.read_text()
    app.stop(signal.SIGTERM)
    shown = start_app("--show-tracebacks", notebook="01", notebook_dir=folder)
    outputs = shown.load_page(marker="kvlab-hidden-detail")
    shown.stop(signal.SIGTERM)
