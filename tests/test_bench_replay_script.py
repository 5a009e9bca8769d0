"""benchmarks/bench_replay.py runs end to end on a small trace and prints the figures it promises."""

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "bench_replay.py"


@pytest.mark.slow
def test_small_run_prints_every_figure():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--sizes", "3000"], capture_output=True, text=True,
                          timeout=300, cwd=SCRIPT.parents[1])
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert "3,001 events" in out or "3,000 events" in out
    assert "exact=True" in out
    for label in ("replay ", "read ", "what-ifs ", "all of `kvlab replay`"):
        assert label in out and "s CPU" in out.split(label, 1)[1].splitlines()[0]
