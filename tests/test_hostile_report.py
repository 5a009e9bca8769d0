"""`kvlab report` and `kvlab app` on hostile inputs (issue 37): a manifest may delete nothing outside its report
folder, nor through a link, nor a folder the report did not make; a notebook that is a FIFO, a device, nested
too deep or without cells is refused by name (exit 2, never exit 3 or a hang); a signal stops a report cleanly,
saying what it wrote."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest

from kvlab.report import MARKER
from tests.test_hostile_inputs import _refused  # (one check of a refusal, shared by the hostile-input tests)

REPO = Path(__file__).resolve().parent.parent


def _notebook(path: Path, *cells: str) -> Path:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_code_cell(source) for source in cells]
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


def _kvlab(*args: str, timeout: float = 60, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """The real CLI in a process of its own: a hang is a failure after ``timeout`` (the child is killed)."""
    env = {**os.environ, "KVLAB_PROGRESS": "0", "PYTHONPATH": os.pathsep.join(
        filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return subprocess.run([sys.executable, "-m", "kvlab.cli", *args], capture_output=True, text=True,
                          timeout=timeout, env=env, cwd=cwd)


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _report_folder(out: Path, files: dict[str, str]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / MARKER).write_text(json.dumps({"kvlab_report_manifest": 1, "files": files}))


# ---- the manifest deletes only inside its own folder (item 1) ---------------------------------------------------

@pytest.mark.parametrize("where", ["beside", "absolute"])
def test_a_manifest_naming_a_file_outside_the_folder_deletes_nothing(where, tmp_path, capsys):
    """A `../victim/precious.txt` or absolute entry (with the file's true SHA-256) was deleted by the report."""
    precious = tmp_path / "victim" / "precious.txt"
    precious.parent.mkdir()
    precious.write_text("precious\n")
    entry = "../victim/precious.txt" if where == "beside" else str(precious)
    out = tmp_path / "site"
    _report_folder(out, {entry: _sha256(precious)})
    nbs = _notebook(tmp_path / "nbs" / "01_tiny.ipynb", "print(1)").parent
    _refused(capsys, ["report", "--notebook-dir", str(nbs), "--no-png", "--out", str(out)],
             f"{MARKER} lists {entry!r}", "nothing was deleted")
    assert precious.read_text() == "precious\n"
    assert sorted(p.name for p in out.iterdir()) == [MARKER]  # nothing written either


def test_a_report_folder_that_is_a_link_is_neither_deleted_through_nor_written_through(tmp_path, capsys):
    """`D/notebooks` a symlink to another folder, `notebooks/precious.txt` listed: deleted through the link."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    precious = elsewhere / "precious.txt"
    precious.write_text("precious\n")
    out = tmp_path / "site"
    _report_folder(out, {"notebooks/precious.txt": _sha256(precious)})
    (out / "notebooks").symlink_to(elsewhere)
    nbs = _notebook(tmp_path / "nbs" / "01_tiny.ipynb", "print(1)").parent
    _refused(capsys, ["report", "--notebook-dir", str(nbs), "--no-png", "--out", str(out)],
             "notebooks there is a link", "never through a link")
    assert precious.read_text() == "precious\n" and sorted(p.name for p in elsewhere.iterdir()) == ["precious.txt"]


@pytest.mark.slow
def test_a_users_empty_folder_survives_force_then_a_plain_report(tmp_path):
    """`mkdir -p D/figures; report --force --no-png; report --no-png` deleted the user's empty figures/."""
    nbs = _notebook(tmp_path / "nbs" / "01_tiny.ipynb", "print('tiny')").parent
    out = tmp_path / "mine"
    (out / "figures").mkdir(parents=True)
    for extra in (["--force"], [], []):
        proc = _kvlab("report", "--out", str(out), "--notebook-dir", str(nbs), "--no-png", "--device", "sim:h200",
                      *extra, timeout=600)
        assert proc.returncode == 0, proc.stderr[-3000:]
        assert (out / "figures").is_dir(), f"after report {extra}: the user's figures/ is gone"
    assert json.loads((out / MARKER).read_text())["folders"] == ["html", "notebooks"]  # made by the report


# ---- notebooks that cannot be read (items 3, 4 and 8) -----------------------------------------------------------

def _deep(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text('{"cells": [], "metadata": {"a": ' + '{"a": ' * 50_000 + "1" + "}" * 50_001
                    + ', "nbformat": 4, "nbformat_minor": 5}')
    return path


def _fifo(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    os.mkfifo(path)
    return path


def _zero(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.symlink_to("/dev/zero")
    return path


def _cellless(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"nbformat": 4, "metadata": {}}))
    return path


NOTEBOOKS = {  # what the file is: (how to make it, what the error says)
    "nested 50,000 deep": (_deep, "nests more than 100 levels deep"),
    "a FIFO": (_fifo, "is a FIFO, not a notebook file"),
    "/dev/zero": (_zero, "is a device, not a notebook file"),
    "a JSON without cells": (_cellless, "missing an expected key: cells"),
}


@pytest.mark.parametrize("command", ["report", "app"])
@pytest.mark.parametrize("kind", list(NOTEBOOKS))
def test_an_unreadable_notebook_is_refused_by_name(command, kind, tmp_path):
    """Deep nesting was exit 3 (RecursionError), a FIFO and /dev/zero hung both commands, a notebook without cells
    was exit 3 in `kvlab app`: now exit 2 naming the file, in seconds, and nothing is written."""
    make, needle = NOTEBOOKS[kind]
    path = make(tmp_path / "nbs" / "01_hostile.ipynb")
    out = tmp_path / "site"
    argv = (["report", "--out", str(out), "--no-png"] if command == "report" else
            ["app", "01", "--no-browser", "--port", "1"]) + ["--notebook-dir", str(path.parent)]
    start = time.monotonic()
    proc = _kvlab(*argv)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.startswith("kvlab: error: ") and proc.stderr.count("\n") == 1, proc.stderr
    assert "01_hostile.ipynb" in proc.stderr and needle in proc.stderr, proc.stderr
    assert time.monotonic() - start < 30
    assert not out.exists()  # refused before anything was written


# ---- a signal stops the report (item 3) -------------------------------------------------------------------------

@pytest.mark.slow
def test_sigterm_stops_a_report_says_what_it_wrote_and_the_next_report_clears_it(tmp_path):
    """SIGTERM while a notebook ran was exit 3 (nbclient's own handler shut the kernel down, then an
    AssertionError): now exit 143, the kernel killed, every file written so far in the manifest."""
    nbs = tmp_path / "nbs"
    _notebook(nbs / "01_slow.ipynb", "import os, time\nif not os.path.exists('go'):\n"
                                     "    open('kernel.pid', 'w').write(str(os.getpid()))\n    time.sleep(120)")
    out = tmp_path / "site"
    env = {**os.environ, "KVLAB_PROGRESS": "0", "PYTHONPATH": str(REPO)}
    proc = subprocess.Popen([sys.executable, "-m", "kvlab.cli", "report", "--out", str(out), "--notebook-dir",
                             str(nbs), "--no-png", "--device", "sim:h200"], env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 120
        while not (nbs / "kernel.pid").is_file() or not (nbs / "kernel.pid").read_text():
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.poll() else ""
            time.sleep(0.1)
        kernel = int((nbs / "kernel.pid").read_text())
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err
    assert "report stopped by SIGTERM after 0 of 1 notebook(s)" in err and "Traceback" not in err, err
    assert f"listed in its {MARKER}" in err and "no index.html yet" in err, err
    time.sleep(0.5)
    assert not Path(f"/proc/{kernel}").exists() or "Z" in Path(f"/proc/{kernel}/stat").read_text().split()[2]
    files = json.loads((out / MARKER).read_text())["files"]
    assert sorted(files) == ["html/plotly.min.js", "notebooks/01_slow.ipynb"]  # the partial copy is kept, as ours
    (nbs / "go").write_text("")
    again = _kvlab("report", "--out", str(out), "--notebook-dir", str(nbs), "--no-png", "--device", "sim:h200",
                   timeout=600)
    assert again.returncode == 0, again.stderr[-3000:]  # the stopped report's files were proven kvlab's, cleared
