"""Progress bars: tqdm's notebook widget in Jupyter, text in a terminal, nothing when not wanted."""

from __future__ import annotations

import os
import sys


def _in_notebook() -> bool:
    ipython = sys.modules.get("IPython")  # a Jupyter kernel has loaded it; elsewhere importing it costs ~0.1 s
    if ipython is None:
        return False
    try:
        shell = ipython.get_ipython()
        return shell is not None and shell.__class__.__name__ == "ZMQInteractiveShell"
    except Exception:
        return False


def progress_bar(total: int | None = None, desc: str = "", *, enabled: bool | None = None, **kwargs):
    """A tqdm bar. ``enabled=None``: on when attached to a terminal or a notebook, and not in CI
    or when $KVLAB_PROGRESS=0."""
    if enabled is None:
        enabled = os.environ.get("KVLAB_PROGRESS", "1") != "0" and (_in_notebook() or sys.stderr.isatty())
    if _in_notebook():
        from tqdm.auto import tqdm
    else:
        from tqdm import tqdm
    return tqdm(total=total, desc=desc, disable=not enabled, leave=False, **kwargs)
