"""Run a notebook headless: the one executor behind ``kvlab report`` and the test suite's notebook runs.

    nb = execute_notebook("notebooks/01_kv_pool_sizing.ipynb", env={"KVLAB_DEVICE": "cpu"})

The conventions both rely on:

- the kernel (``python3``) runs in the notebook's own folder, as in JupyterLab;
- environment variables are set in a cell of their own at the very top (tag ``injected-env``), before any
  ``import kvlab``; rendered pages leave that cell out (``kvlab.viz.offline``);
- parameters follow papermill: a cell tagged ``injected-parameters`` goes right after the cell tagged
  ``parameters`` if there is one, otherwise first, so injected values override the defaults;
- ``timeout`` is per cell, in seconds (nbclient's meaning); widget state is kept in ``nb.metadata.widgets``.

Every notebook is read by :func:`read_notebook` (``kvlab report`` and ``kvlab app`` too): a regular file of at most
``MAX_NOTEBOOK_BYTES``, JSON nested at most ``MAX_NOTEBOOK_DEPTH`` deep, that nbformat validates; anything else (a
FIFO, ``/dev/zero``, a file without ``cells``) is a :class:`NotebookFormatError` naming the file.

Nothing is written back to the source notebook. A failing cell, a cell timeout or a dead kernel raises
:class:`NotebookExecutionError`, which carries the partly executed notebook and the failing cell's index in the
*source* notebook (injected cells not counted).
"""

from __future__ import annotations

import json
import os
import re
import stat
import threading
from pathlib import Path
from typing import Any

ENV_TAG = "injected-env"
PARAMETERS_TAG = "injected-parameters"
KERNEL_NAME = "python3"
CELL_TIMEOUT_S = 600
MAX_NOTEBOOK_BYTES = 256 << 20  # an executed notebook with plots and widget state is a few MB
MAX_NOTEBOOK_DEPTH = 100  # JSON nesting: a notebook's plots and widget state nest about 15 deep
_KERNEL_STOP_WAIT_S = 15.0  # after a signal: how long the partly executed copy may take to be written
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


def _depth(value: Any, limit: int) -> int:
    """How deep lists and dicts nest in ``value`` (a scalar is 0), counted without recursion; stops past ``limit``."""
    deepest, stack = 0, [(value, 1)] if isinstance(value, (dict, list)) else []
    while stack and deepest <= limit:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def _read_bounded(path: Path) -> bytes:
    """The bytes of the regular file ``path``; a FIFO, socket or device is refused without blocking on it."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO opens at once (and is refused below)
    except OSError as exc:
        raise NotebookFormatError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    with os.fdopen(fd, "rb") as f:
        mode, size = os.fstat(fd).st_mode, os.fstat(fd).st_size
        if not stat.S_ISREG(mode):
            kind = ("a folder" if stat.S_ISDIR(mode) else "a FIFO" if stat.S_ISFIFO(mode) else "a socket"
                    if stat.S_ISSOCK(mode) else "a device")
            raise NotebookFormatError(f"{path}: is {kind}, not a notebook file; kvlab reads notebooks from "
                                      f"regular .ipynb files only")
        data = f.read(MAX_NOTEBOOK_BYTES + 1) if size <= MAX_NOTEBOOK_BYTES else b""
    if size > MAX_NOTEBOOK_BYTES or len(data) > MAX_NOTEBOOK_BYTES:
        raise NotebookFormatError(f"{path}: {max(size, len(data)):,} bytes, more than a notebook kvlab reads "
                                  f"({MAX_NOTEBOOK_BYTES:,} bytes at most)")
    return data


def read_notebook(path: str | os.PathLike[str]):
    """The notebook at ``path`` as nbformat v4, or :class:`NotebookFormatError` naming the file: not a regular file
    (a FIFO would block forever, ``/dev/zero`` never ends), larger than ``MAX_NOTEBOOK_BYTES``, not UTF-8 JSON,
    nested deeper than ``MAX_NOTEBOOK_DEPTH`` (a RecursionError further on), or not a valid notebook (no
    ``cells``)."""
    import nbformat

    path = Path(path)
    data = _read_bounded(path)
    try:
        text = data.decode("utf-8")
        depth = _depth(json.loads(text), MAX_NOTEBOOK_DEPTH)
    except RecursionError:
        depth = MAX_NOTEBOOK_DEPTH + 1
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError
        raise NotebookFormatError(f"{path}: not a notebook kvlab can run (not UTF-8 JSON: {exc})") from None
    if depth > MAX_NOTEBOOK_DEPTH:
        raise NotebookFormatError(f"{path}: not a notebook kvlab can run (its JSON nests more than "
                                  f"{MAX_NOTEBOOK_DEPTH} levels deep)")
    invalid: dict = {}
    try:
        nb = nbformat.reads(text, as_version=4, capture_validation_error=invalid)
    except (nbformat.ValidationError, ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:
        invalid["ValidationError"] = exc
    if invalid:  # a JSON file without cells, or not a notebook at all: the user's file, named (it was exit 3)
        exc = invalid["ValidationError"]
        what = str(exc).strip().splitlines()[0][:160] if str(exc).strip() else type(exc).__name__
        raise NotebookFormatError(f"{path}: not a notebook kvlab can run ({what})")
    return nb


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

    The cells run in a thread of their own, so this (main) thread keeps its signal handlers (nbclient would put
    its own on SIGINT and SIGTERM, then fail on the kernel they shut down): an exception raised here while
    waiting (``KeyboardInterrupt``, or what the caller's handler raises) kills the kernel, waits for the partly
    executed copy to be saved, and propagates.
    """
    from nbclient import NotebookClient

    path = Path(path).resolve()
    nb = read_notebook(path)
    inject_cells(nb, parameters, env)
    client = NotebookClient(nb, timeout=timeout, kernel_name=kernel_name, store_widget_state=True,
                            resources={"metadata": {"path": str(path.parent)}}, config=kernel_config())
    outcome: list[BaseException | None] = []
    done = threading.Event()  # not Thread.join: a join a signal interrupts can mark a running thread stopped
    threading.Thread(target=_run_client, args=(client, path, nb, output_path, outcome, done),
                     name=f"kvlab-notebook-{path.stem}", daemon=True).start()
    try:
        while not done.wait(0.2):
            pass
    except BaseException:
        _stop_kernel(client, done)
        raise
    if outcome[0] is not None:
        raise outcome[0]
    return nb


def _run_client(client, path: Path, nb, output_path, outcome: list, done: threading.Event) -> None:
    """The worker thread: execute, save the copy (also a partial one), put the error (or None) in ``outcome``,
    then set ``done``."""
    import nbformat
    from nbclient.exceptions import CellExecutionError, CellTimeoutError, DeadKernelError

    error: BaseException | None = None
    try:
        client.execute()
    except (CellExecutionError, CellTimeoutError, DeadKernelError) as exc:
        error = NotebookExecutionError(path, nb, failing_cell(nb), exc)
    except BaseException as exc:  # handed to the caller's thread, which raises it
        error = exc
    try:
        if output_path is not None:
            Path(output_path).parent.mkdir(parents=True, exist_ok=True)
            nbformat.write(nb, Path(output_path))
    except BaseException as exc:
        error = error or exc
    finally:
        outcome.append(error)
        done.set()


def _stop_kernel(client, done: threading.Event) -> None:
    """Kill the kernel's process group (again, should the worker start one meanwhile) until the worker is done,
    at most ``_KERNEL_STOP_WAIT_S``: the worker then saves the partly executed copy."""
    import signal
    import time

    deadline = time.monotonic() + _KERNEL_STOP_WAIT_S
    while not done.is_set() and time.monotonic() < deadline:
        provisioner = getattr(getattr(client, "km", None), "provisioner", None)
        group, pid = getattr(provisioner, "pgid", None), getattr(provisioner, "pid", None)
        try:
            if group and group != os.getpgrp():  # the kernel leads its own session (jupyter_client's launcher)
                os.killpg(group, signal.SIGKILL)
            elif pid:
                os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        done.wait(0.1)
