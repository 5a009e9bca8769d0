"""``kvlab app`` stops cleanly and does not hoard kernels.

The real CLI (``python -m kvlab.cli app``) serves tests/fixtures/smoke.ipynb through ``--notebook-dir`` (a few
seconds to run, where notebook 01 takes ~20 s; the lifecycle does not depend on the notebook). Voila runs the
notebook server-side when the page is requested, so a plain HTTP GET starts a kernel, and a client that has
gone away (no websocket) is what a closed tab or a sleeping laptop leaves behind. Processes are read from
/proc, independently of kvlab.app's own process walk.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterator

import pytest

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"
DEVICE = "cpu"  # the smoke notebook echoes KVLAB_DEVICE into its page

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="process checks read /proc (Linux)"),
]


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
        return f"http://127.0.0.1:{self.port}/"

    def load_page(self) -> None:
        """GET the dashboard: Voila starts a kernel, runs the notebook and streams the page back."""
        with urllib.request.urlopen(self.url, timeout=120) as response:
            page = response.read().decode()
        assert f"kvlab-smoke-ready scale=1 device={DEVICE}" in page, page[-2000:]

    def voila(self) -> Proc:
        children = [p for p in _tree(self.process.pid) if p.ppid == self.process.pid and " voila " in p.cmdline]
        assert len(children) == 1, children
        return children[0]

    def stop(self, sig: int, timeout: float = 60) -> str:
        self.process.send_signal(sig)
        try:
            self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            pytest.fail(f"kvlab app still running {timeout:g} s after {sig!r}:\n{self.log.read_text()[-4000:]}")
        return self.log.read_text()


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

    def start(*extra: str) -> App:
        port = _free_port()
        log = tmp_path / f"app-{port}.log"
        env = {**os.environ, "PYTHONPATH": str(REPO), "JUPYTER_PLATFORM_DIRS": "1",
               "JUPYTER_RUNTIME_DIR": str(tmp_path / "runtime")}
        with log.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "kvlab.cli", "app", "smoke", "--notebook-dir", str(FIXTURES),
                 "--port", str(port), "--no-browser", "--device", DEVICE, *extra],
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


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_stops_voila_and_every_kernel_and_frees_the_port(start_app, sig: signal.Signals):
    app = start_app()
    app.load_page()
    app.load_page()
    voila = app.voila()
    kernels = _kernels(app.process.pid)
    assert len(kernels) == 2, kernels  # one per page load
    assert all(k.ppid == voila.pid for k in kernels)

    log = app.stop(sig)

    assert app.process.returncode == 0, log
    assert f"kvlab app: stopped ({sig.name}); Voila and its 2 kernel(s) shut down" in log
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
