"""benchmarks/bytecode_count.py counts the bytecodes of the three arms on a small trace, the same on every run."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "bytecode_count.py"


def _counts(trace: Path) -> tuple[str, dict[str, int]]:
    proc = subprocess.run([sys.executable, str(SCRIPT), "--trace", str(trace), "--requests", "30", "--top", "4"],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    arms = {m[1]: int(m[2].replace(",", "")) for m in re.finditer(r"^  (page\S*)\s+([\d,]+) bytecodes", proc.stdout,
                                                                   re.M)}
    return proc.stdout, arms


@pytest.mark.slow
def test_counts_each_arm_the_same_on_every_run(tmp_path):
    trace = tmp_path / "conversation.jsonl"
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "make_mooncake_trace.py"), "--out", str(trace),
                    "--preset", "conversation", "--force"], check=True, capture_output=True, timeout=120)
    out, arms = _counts(trace)
    assert list(arms) == ["page", "page+host", "page+storage"]
    assert arms["page"] < arms["page+host"] < arms["page+storage"]  # each tier adds work
    assert "1.000x the plain run" in out and f"where host + storage's {arms['page+storage'] - arms['page']:,} more" in out
    assert len(re.findall(r"^\s+[+-][\d,]+ \(", out, re.M)) == 4  # --top 4 functions listed
    assert _counts(trace)[1] == arms  # counted, not timed: the same again
