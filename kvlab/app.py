"""``kvlab app``: one notebook as a Voila dashboard, for projector demos.

Voila runs the notebook in a fresh kernel and shows only outputs (``--strip_sources=True``: code hidden) with
live widgets, so the panels of notebooks 01/02 work as in JupyterLab. It listens on 127.0.0.1 only: a demo
laptop on a conference network should not serve a kernel to the room.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from kvlab.report import DEFAULT_NOTEBOOK_DIR, ReportError, select_notebooks

HOST = "127.0.0.1"


class AppError(RuntimeError):
    """Unknown notebook or Voila missing."""


def find_notebook(key: str, notebook_dir: Path = DEFAULT_NOTEBOOK_DIR) -> Path:
    """``01`` or ``01_kv_pool_sizing`` -> notebooks/01_kv_pool_sizing.ipynb (exactly one match)."""
    try:
        matches = select_notebooks(notebook_dir, [key])
    except ReportError as exc:
        raise AppError(str(exc).replace("--notebooks", "kvlab app")) from None
    if len(matches) != 1:
        raise AppError(f"kvlab app {key!r}: matches {len(matches)} notebooks: {', '.join(m.stem for m in matches)}")
    return matches[0]


def voila_command(notebook: Path, *, port: int, open_browser: bool = False) -> list[str]:
    """The Voila command line (``python -m voila`` so the kernel runs in this interpreter's environment)."""
    cmd = [sys.executable, "-m", "voila", str(notebook), f"--port={port}", f"--Voila.ip={HOST}",
           "--strip_sources=True", "--show_tracebacks=True", "--theme=light",
           f"--Voila.root_dir={notebook.parent}"]
    if not open_browser:
        cmd.append("--no-browser")
    return cmd


def app_env(device: str | None) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("KVLAB_PROGRESS", "0")
    if device:
        env["KVLAB_DEVICE"] = device
    return env


def serve(key: str, *, port: int = 8866, device: str | None = None, open_browser: bool = True) -> int:
    """Run Voila in the foreground until interrupted; returns its exit status."""
    try:
        import voila  # noqa: F401
    except ImportError:
        raise AppError("voila is not installed: pip install voila (or pip install -e .)") from None
    notebook = find_notebook(key)
    cmd = voila_command(notebook, port=port, open_browser=open_browser)
    print(f"kvlab app: serving {notebook.name} at http://{HOST}:{port}/ (Ctrl-C to stop)", flush=True)
    try:
        return subprocess.call(cmd, cwd=notebook.parent, env=app_env(device))
    except KeyboardInterrupt:
        return 0


__all__ = ["AppError", "HOST", "find_notebook", "serve", "voila_command"]
