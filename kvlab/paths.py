"""Where kvlab's shipped files are: ``data/`` (the tiny checkpoint, the sample traces, the example snapshot;
see data/README.md) and ``notebooks/``. Every module finds them here, never through ``Path(__file__).parents``.

In order:

1. ``KVLAB_DATA_DIR`` / ``KVLAB_NOTEBOOK_DIR``, when set: your own copies.
2. An installed wheel: copies of both under ``kvlab/_shipped/`` (``setup.py``'s build step puts them there;
   ``data/`` and ``notebooks/*.ipynb`` of the source tree, nothing else).
3. A checkout, also an editable install (``pip install -e .``): the repository's ``data/`` and
   ``notebooks/`` beside ``kvlab/``.

When none exists the checkout's path is returned all the same, so the error that follows names a path.
The variables are read when a module asks (module constants such as ``EXAMPLE_SNAPSHOT`` ask at import).
"""

from __future__ import annotations

import os
from pathlib import Path

PACKAGE_DIR = Path(__file__).resolve().parent
SHIPPED_DIR = PACKAGE_DIR / "_shipped"  # only in a wheel
CHECKOUT_DIR = PACKAGE_DIR.parent
DATA_ENV = "KVLAB_DATA_DIR"
NOTEBOOK_ENV = "KVLAB_NOTEBOOK_DIR"


def _find(name: str, env: str) -> Path:
    override = os.environ.get(env)
    if override:
        return Path(override).expanduser().resolve()
    if (SHIPPED_DIR / name).is_dir():
        return SHIPPED_DIR / name
    return CHECKOUT_DIR / name


def data_dir() -> Path:
    """The folder holding ``tiny-llama/``, ``traces/`` and ``snapshots/``."""
    return _find("data", DATA_ENV)


def notebook_dir() -> Path:
    """The folder holding the teaching notebooks (``00_caching_allocator_tour.ipynb`` ...)."""
    return _find("notebooks", NOTEBOOK_ENV)


def data_path(*parts: str) -> Path:
    """A shipped file: ``data_path("traces", "mooncake_small.jsonl")``."""
    return data_dir().joinpath(*parts)


def shown_path(path: str | os.PathLike) -> str:
    """``path`` relative to the working directory when that is shorter: how a command to run from here names it."""
    try:
        relative = os.path.relpath(path)
    except ValueError:  # another drive (Windows)
        return str(path)
    return relative if len(relative) < len(str(path)) else str(path)
