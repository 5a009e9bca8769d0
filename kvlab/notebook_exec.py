"""Run a notebook headless: the one executor behind ``kvlab report`` and the test suite's notebook runs.

    nb = execute_notebook("notebooks/01_kv_pool_sizing.ipynb", env={"KVLAB_DEVICE": "cpu"})

The conventions both rely on:

- the kernel (``python3``) runs in the notebook's own folder, as in JupyterLab;
- environment variables are set in a cell of their own at the very top (tag ``injected-env``), before any
  ``import kvlab``; rendered pages leave that cell out (``kvlab.viz.offline``);
- parameters follow papermill: a cell tagged ``injected-parameters`` goes right after the cell tagged
  ``parameters`` if there is one, otherwise first, so injected values override the defaults;
- ``timeout`` is per cell, in seconds (nbclient's meaning); widget state is kept in ``nb.metadata.widgets``.

Nothing is written back to the source notebook. A failing cell, a cell timeout or a dead kernel raises
:class:`NotebookExecutionError`, which carries the partly executed notebook and the failing cell's index in the
*source* notebook (injected cells not counted).
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

ENV_TAG = "injected-env"
PARAMETERS_TAG = "injected-parameters"
KERNEL_NAME = "python3"
CELL_TIMEOUT_S = 600
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def strip_ansi(text: str) -> str:
    """``text`` without terminal colour codes (tracebacks from a kernel carry them)."""
    return _ANSI_ESCAPE.sub("", text)


class NotebookExecutionError(RuntimeError):
    """A cell of ``path`` failed. ``notebook``: the partly executed notebook (outputs up to and including the
    failing cell); ``cell``: that cell's index in the source notebook, or None when no cell shows an error (a
    dead kernel); ``cause``: nbclient's exception. The message holds the path, the cell and the traceback."""

    def __init__(self, path: Path, notebook: Any, cell: int | None, cause: BaseException) -> None:
        self.path, self.notebook, self.cell, self.cause = Path(path), notebook, cell, cause
        where = f"cell {cell}" if cell is not None else "a cell"
        self.headline = f"{self.path.name}: {where} failed ({type(cause).__name__})"
        self.detail = strip_ansi(str(cause)).strip()
        super().__init__(f"{self.path}: {where} failed ({type(cause).__name__})\n{self.detail}")

    @property
    def last_line(self) -> str:
        """The traceback's last line (``ValueError: broken on purpose``), or the exception's name."""
        return self.detail.splitlines()[-1] if self.detail else type(self.cause).__name__


class NotebookFormatError(ValueError):
    """A notebook file nbformat cannot read as a notebook (no ``cells``, not JSON); the message names it (a
    ValueError, so ``kvlab`` reports it as the user's error; this module imports nothing of kvlab)."""


def _injected_cell(source: str, tag: str):
    import nbformat

    cell = nbformat.v4.new_code_cell(source)
    cell.metadata["tags"] = [tag]
    return cell


def inject_cells(nb, parameters: dict[str, Any] | None = None, env: dict[str, str] | None = None):
    """Insert the env cell (first) and the parameters cell (after the ``parameters`` cell, else first)."""
    if parameters:
        lines = ["# Parameters injected by kvlab.notebook_exec"]
        lines += [f"{name} = {value!r}" for name, value in parameters.items()]
        tagged = [i for i, c in enumerate(nb.cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
        at = tagged[0] + 1 if tagged else 0
        nb.cells.insert(at, _injected_cell("\n".join(lines), PARAMETERS_TAG))
    if env:
        lines = ["# Environment injected by kvlab.notebook_exec", "import os"]
        lines += [f"os.environ[{name!r}] = {str(value)!r}" for name, value in env.items()]
        nb.cells.insert(0, _injected_cell("\n".join(lines), ENV_TAG))
    return nb


def failing_cell(nb) -> int | None:
    """The source-notebook index of the first code cell with an error output (injected cells not counted)."""
    injected = 0
    for index, cell in enumerate(nb.cells):
        if {ENV_TAG, PARAMETERS_TAG} & set(cell.get("metadata", {}).get("tags", [])):
            injected += 1
        elif cell.cell_type == "code" and any(o.get("output_type") == "error" for o in cell.get("outputs", [])):
            return index - injected
    return None


def kernel_config():
    """The kernel manager's settings: CurveZMQ keys provisioned by the manager (jupyter_client 8.10+), where pyzmq
    has Curve and the kernelspec declares it. The kernel's sockets are then encrypted, and ipykernel does not print
    its "running over TCP without encryption" warning once per notebook."""
    import zmq
    from jupyter_client.manager import KernelManager
    from traitlets.config import Config

    config = Config()
    if zmq.has("curve") and "transport_encryption" in KernelManager.class_trait_names():
        config.KernelManager.transport_encryption = "auto"  # 'auto': only where the kernelspec supports it
    return config


def execute_notebook(path: str | os.PathLike[str], timeout: int = CELL_TIMEOUT_S,
                     parameters: dict[str, Any] | None = None, *, env: dict[str, str] | None = None,
                     output_path: str | os.PathLike[str] | None = None, kernel_name: str = KERNEL_NAME):
    """Execute ``path`` with its own folder as the kernel's cwd and return the executed notebook.

    ``output_path`` saves the executed copy, also when a cell fails (never point it at the source notebook).
    Raises :class:`NotebookExecutionError` when a cell fails, times out or the kernel dies.
    """
    import nbformat
    from nbclient import NotebookClient
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    path = Path(path).resolve()
    try:
        nb = nbformat.read(path, as_version=4)
    except (nbformat.ValidationError, ValueError, KeyError, TypeError, AttributeError) as exc:
        # a JSON file without cells, or not a notebook at all: the user's file, named (it was exit 3: issue 26)
        what = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise NotebookFormatError(f"{path}: not a notebook kvlab can run ({what})") from None
    inject_cells(nb, parameters, env)
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name, store_widget_state=True,
                            resources={"metadata": {"path": str(path.parent)}}, config=kernel_config())
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        raise NotebookExecutionError(path, nb, failing_cell(nb), exc) from exc
    finally:
        if output_path is not None:
            Path(output_path).parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, Path(output_path))
    return nb
