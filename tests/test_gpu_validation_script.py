"""benchmarks/gpu_validation.py without CUDA: a clear message and exit status 2, and no result file.

``CUDA_VISIBLE_DEVICES=''`` hides every GPU, so the no-CUDA branch is tested on GPU machines too.
"""

import os
import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_validation.py"


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    return subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=120, env=env)


def test_exits_2_with_a_clear_message_without_cuda(tmp_path):
    out = tmp_path / "result.json"
    proc = _run("--out", str(out))
    assert proc.returncode == 2, proc.stderr
    assert "no CUDA device" in proc.stderr and "torch.cuda.is_available() is False" in proc.stderr
    assert "nothing to validate" in proc.stderr
    assert not out.exists()  # a machine without a GPU must not leave a result that looks like a pass


def test_help_documents_the_out_option():
    proc = _run("--help")
    assert proc.returncode == 0 and "--out" in proc.stdout and "--preset" in proc.stdout
