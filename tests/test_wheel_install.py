"""kvlab installed from its wheel, away from the checkout: the CLI and a notebook find the shipped files.

Builds the wheel from a copy of the source files (``pip wheel --no-deps``), installs it without its
dependencies into a fresh venv that sees this environment's packages (torch, jupyter, ...), and runs the CLI
and ``kvlab report`` (which executes a notebook headless) from an empty folder with ``PYTHONPATH`` unset, so
neither the checkout nor its editable install can stand in for the wheel.
"""

from __future__ import annotations

import json
import os
import shutil
import site
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = ("pyproject.toml", "setup.py", "MANIFEST.in", "README.md", "kvlab", "data", "notebooks")
pytestmark = pytest.mark.slow


class Installed:
    def __init__(self, venv: Path, cwd: Path) -> None:
        self.venv, self.cwd = venv, cwd
        self.python = venv / "bin" / "python"
        env = {k: v for k, v in os.environ.items()
               if k not in ("PYTHONPATH", "KVLAB_DATA_DIR", "KVLAB_NOTEBOOK_DIR", "KVLAB_DEVICE")}
        env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
        # nbconvert's templates live in this environment's share/jupyter, which a venv does not search by itself
        from jupyter_core.paths import jupyter_path

        env["JUPYTER_PATH"] = os.pathsep.join(jupyter_path())
        self.env = env

    def run(self, *args: str, timeout: int = 300) -> subprocess.CompletedProcess:
        proc = subprocess.run(list(args), cwd=self.cwd, env=self.env, capture_output=True, text=True, timeout=timeout)
        assert proc.returncode == 0, f"{' '.join(args)} -> {proc.returncode}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
        return proc

    def python_out(self, code: str) -> str:
        return self.run(str(self.python), "-c", code).stdout.strip()


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp = tmp_path_factory.mktemp("wheel")
    src = tmp / "src"
    for name in SOURCES:
        if (ROOT / name).is_dir():
            shutil.copytree(ROOT / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "_shipped"))
        else:
            src.mkdir(exist_ok=True)
            shutil.copy2(ROOT / name, src / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                    "-w", str(tmp / "dist"), str(src)], check=True, capture_output=True, timeout=300)
    (wheel,) = (tmp / "dist").glob("kvlab-*.whl")
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)], check=True, timeout=300)
    if sys.prefix != sys.base_prefix:  # run from a venv: its packages are not the "system" ones of the new venv
        (lib,) = (venv / "lib").glob("python3*/site-packages")
        (lib / "_outer_environment.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    cwd = tmp / "elsewhere"
    cwd.mkdir()
    installed = Installed(venv, cwd)
    installed.run(str(installed.python), "-m", "pip", "install", "-q", "--no-deps", "--no-index", str(wheel))
    return installed


def test_the_wheel_carries_data_and_notebooks(installed):
    out = json.loads(installed.python_out(
        "import json, kvlab, kvlab.paths as p; from jupyter_client.kernelspec import KernelSpecManager; "
        "print(json.dumps({'kvlab': kvlab.__file__, 'data': str(p.data_dir()), 'notebooks': str(p.notebook_dir()),"
        " 'kernel': KernelSpecManager().get_kernel_spec('python3').argv[0]}))"))
    site_packages = Path(out["kvlab"]).parents[1]
    assert site_packages.is_relative_to(installed.venv), out  # the wheel's kvlab, not the checkout's
    kernel = shutil.which(out["kernel"], path=installed.env["PATH"])  # a kernelspec may say just "python"
    assert Path(kernel).parent == installed.venv / "bin", out  # notebooks' kernels run the venv's Python too
    shipped = site_packages / "kvlab" / "_shipped"
    assert Path(out["data"]) == shipped / "data" and Path(out["notebooks"]) == shipped / "notebooks"
    for name in ("tiny-llama/model.safetensors", "traces/mooncake_small.jsonl", "snapshots/example.pickle"):
        assert (shipped / "data" / name).read_bytes() == (ROOT / "data" / name).read_bytes(), name
    assert sorted(p.name for p in (shipped / "notebooks").iterdir()) == sorted(
        p.name for p in (ROOT / "notebooks").glob("*.ipynb"))


def test_the_cli_loads_the_shipped_checkpoint(installed):
    """tiny-h100 loads data/tiny-llama's real weights: without the shipped file the command fails."""
    result = json.loads(installed.run("kvlab", "repro", "kv-pool-sizing", "--preset", "tiny-h100", "--json").stdout)
    assert result["accepted"] and result["max_total_num_tokens"] > 0


def test_kvlab_report_executes_a_shipped_notebook(installed):
    """Notebook 04 reads the shipped example snapshot and trace inside its kernel."""
    out = installed.cwd / "report"
    proc = installed.run("kvlab", "report", "--notebooks", "04", "--no-png", "--out", str(out), timeout=900)
    assert "04_bring_your_own" in proc.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["notebooks"] == {"04_bring_your_own": summary["notebooks"]["04_bring_your_own"]}
    assert summary["notebooks"]["04_bring_your_own"]["ok"], summary["notebooks"]
    executed = json.loads((out / "notebooks" / "04_bring_your_own.ipynb").read_text())
    errors = [o for c in executed["cells"] for o in c.get("outputs", []) if o.get("output_type") == "error"]
    assert not errors and (out / "html" / "04_bring_your_own.html").is_file()
