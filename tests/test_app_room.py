"""``kvlab app`` for a room (issue 35 item 2): bound to the network with the token kept, a "pool warm" line once the
pre-heated kernels have run the notebook, a quiet log, and no traceback when stopped mid-notebook.

Real servers (the CLI, Voila, kernels), as in tests/test_app_lifecycle.py, whose ``start_app`` fixture they use.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from kvlab.app import HOST, room_urls, voila_command, write_dashboard
from kvlab.cli import build_parser
from tests.test_app_lifecycle import _kernels, _wait_for, start_app  # noqa: F401  (the fixture)


def _own_address() -> str | None:
    """A non-loopback IPv4 address of this machine (``hostname -I``), or None."""
    try:
        out = subprocess.run(["hostname", "-I"], capture_output=True, text=True, timeout=10).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    return next((a for a in out if re.fullmatch(r"\d+\.\d+\.\d+\.\d+", a) and not a.startswith("127.")), None)


def _notebook(folder: Path, *sources: str) -> None:
    import nbformat

    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(s) for s in sources]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    folder.mkdir(exist_ok=True)
    nbformat.write(nb, folder / "01_room.ipynb")


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args, **kwargs):
        return None


def test_the_ip_flag_reaches_voila_and_the_urls_name_the_address(tmp_path: Path):
    from kvlab.app import find_notebook

    assert build_parser().parse_args(["app", "02"]).ip == HOST
    assert build_parser().parse_args(["app", "02", "--ip", "0.0.0.0"]).ip == "0.0.0.0"
    notebook = find_notebook("01")
    cmd = voila_command(notebook, page=write_dashboard(notebook, tmp_path), port=8899, ip="0.0.0.0")
    assert "--Voila.ip=0.0.0.0" in cmd and "--KernelManager.transport=ipc" in cmd
    assert room_urls("127.0.0.1", 8899, "t") == ("http://127.0.0.1:8899/?token=t",) * 2
    assert room_urls("192.0.2.7", 8899, None) == ("http://192.0.2.7:8899/", "http://192.0.2.7:8899/")
    url, local = room_urls("0.0.0.0", 8899, "t")
    assert local == "http://127.0.0.1:8899/?token=t" and url.endswith(":8899/?token=t") and "0.0.0.0" not in url


def test_an_address_this_machine_does_not_have_is_refused_by_name():
    result = subprocess.run([sys.executable, "-m", "kvlab.cli", "app", "01", "--ip", "192.0.2.254", "--no-browser"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stderr
    assert "kvlab: error: kvlab app --ip 192.0.2.254 --port 8866: cannot listen there" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_room_server_answers_on_the_lan_address_with_the_token_and_refuses_without(start_app):  # noqa: F811
    address = _own_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    app = start_app("--ip", "0.0.0.0")
    log = app.log.read_text()
    printed = re.search(r"attendees open (http://\S+) \(this machine: ", log)
    assert printed, log
    url = printed.group(1)
    assert url.startswith(f"http://{address}:{app.port}/?token="), (url, address)
    assert "not encrypted" in log and "reverse proxy" in log
    with urllib.request.urlopen(url, timeout=120) as response:  # from the network, with the token: the page
        assert response.status == 200 and "jupyter-config-data" in response.read().decode()
    kernels = len(_kernels(app.process.pid))
    bare = f"http://{address}:{app.port}/"
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.build_opener(_NoRedirect).open(bare, timeout=60)
    assert refused.value.code in (302, 403), refused.value.code  # the login page, not the notebook
    assert len(_kernels(app.process.pid)) == kernels  # no kernel for a request without the token
    out = app.stop(signal.SIGTERM)
    assert app.process.returncode == 0, out


@pytest.mark.slow
def test_pool_warm_is_logged_once_the_preheated_kernel_has_run_the_notebook(start_app, tmp_path: Path):  # noqa: F811
    folder, marker = tmp_path / "nbs", tmp_path / "ran-to-the-end"
    _notebook(folder, "import time\ntime.sleep(4)", f"open({str(marker)!r}, 'w').write('done')")
    app = start_app("--workshop", "1", notebook="01", notebook_dir=folder)
    warm = re.compile(r"pool warm: 1 kernel\(s\) ready in \d+\.\d s")
    _wait_for(lambda: warm.search(app.log.read_text()), 240, "the pool-warm line", app.log)
    assert marker.exists(), "pool warm was logged before the notebook's last cell ran"
    log = app.log.read_text()
    assert log.index("is filled with 1 kernel") < warm.search(log).start()  # started, then warm
    out = app.stop(signal.SIGTERM)
    assert "Traceback" not in out, out
    for noise in ("without encryption", "is not trusted\n", "websocket_ping_timeout"):  # explained once, not per page
        assert noise not in out.replace("is not trusted\" is not shown", ""), noise


@pytest.mark.slow
def test_sigterm_while_a_preheated_kernel_runs_the_notebook_prints_no_traceback(start_app, tmp_path: Path):  # noqa: F811
    folder = tmp_path / "nbs"
    _notebook(folder, *["import time\ntime.sleep(0.3)"] * 200)  # a minute of short cells: stopped mid-cell
    app = start_app("--workshop", "1", notebook="01", notebook_dir=folder)
    _wait_for(lambda: "is filled with 1 kernel" in app.log.read_text(), 180, "the pool kernel", app.log)
    _wait_for(lambda: len(_kernels(app.process.pid)) == 1, 60, "the kernel running", app.log)
    import time

    time.sleep(6)  # well into the notebook's cells
    out = app.stop(signal.SIGTERM)
    assert app.process.returncode == 0, out
    assert "Traceback" not in out and "ZMQError" not in out, out
