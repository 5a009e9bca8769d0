"""Words that depend on where a page is read: live (a kernel behind the controls: JupyterLab, Voila, ``kvlab app``)
or static (``kvlab report``'s offline pages, where no control answers). The report's kernels run with
``KVLAB_STATIC=1`` (``kvlab.report.kernel_env``), so a figure title or a panel's hint never asks a report reader to
move a control that does nothing there."""

from __future__ import annotations

import os

STATIC_ENV = "KVLAB_STATIC"


def is_static() -> bool:
    """True when the page is being rendered for the static report."""
    return os.environ.get(STATIC_ENV, "") == "1"


def live_or_static(live: str, static: str) -> str:
    """``live`` where a reader can act on it, else ``static``."""
    return static if is_static() else live
