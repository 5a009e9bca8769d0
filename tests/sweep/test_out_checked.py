"""``kvlab sweep --out`` is checked before any worker starts or any request is loaded: a folder, a device or
FIFO, a file on the way, a folder that cannot take a new file each give one ``kvlab: error:`` line naming the
flag, the path and why (no raw errno, no leaked-semaphore warning from a pool started and then abandoned)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from kvlab.cli import main

from .conftest import TINY

SWEEP = ["sweep", "--trace", str(TINY), "--kv-pages", "30"]


def _cases(tmp_path):
    folder = tmp_path / "rows.csv"
    folder.mkdir()
    fifo = tmp_path / "pipe.csv"
    os.mkfifo(fifo)
    plain = tmp_path / "notes.txt"
    plain.write_text("mine")
    return [
        (folder, "is a folder"),
        (fifo, "is not a regular file"),
        ("/dev/null", "is not a regular file"),
        (plain / "rows.csv", f"{plain} is not a folder"),
        (plain / "a" / "b" / "rows.csv", f"{plain} is not a folder"),
        ("/proc/kvlab-rows.csv", "cannot create a file in the folder /proc"),  # refused even to root
        (tmp_path / "rows.txt", "unknown format '.txt'"),
    ]


def test_an_unusable_out_is_refused_before_anything_runs(tmp_path, capsys):
    for out, why in _cases(tmp_path):
        assert main(SWEEP + ["--out", str(out)]) == 2, out
        err = capsys.readouterr().err
        assert err.startswith(f"kvlab: error: --out {out}: ") and why in err, err
        assert err.count("\n") == 1, err
    assert (tmp_path / "notes.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt", "pipe.csv", "rows.csv"]


@pytest.mark.parametrize("engine_args", [[], ["--workers", "2"]])
def test_no_pool_starts_for_an_unusable_out(engine_args, tmp_path):
    """Through the console script: one line, exit 2, no multiprocessing noise on stderr."""
    proc = subprocess.run([sys.executable, "-m", "kvlab.cli", *SWEEP, *engine_args, "--out", "/proc/x/rows.csv"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith("kvlab: error: --out /proc/x/rows.csv: ") and proc.stderr.count("\n") == 1


def test_a_usable_out_still_resumes(tmp_path, capsys):
    out = tmp_path / "new" / "rows.csv"
    assert main(SWEEP + ["--out", str(out)]) == 0
    first = out.read_text()
    assert main(SWEEP + ["--out", str(out)]) == 0 and out.read_text() == first
    assert "already in rows.csv" in capsys.readouterr().out
    assert not [p for p in out.parent.iterdir() if p.name.startswith(".kvlab-out-check")]
