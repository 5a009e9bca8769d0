"""How large an input file kvlab reads: the limit follows the memory this machine has now.

Each reader holds far more than the file in memory while it works (measured on the shipped and real inputs):
a Mooncake-format trace about 27 times its size (the records, then the requests and their token sequences), a
torch memory snapshot about 9 times (the pickle's objects, then the replay's tables), a server start-up log about
2.5 times. :data:`EXPANSION` rounds those up. A file whose size times its reader's factor exceeds the memory
available now (:func:`available_memory`) is refused before a byte of it is read (:func:`check_size`), naming the
file (or the flag that gave it), its size and the limit: a 4 GB trace is an exit-2 error, never a ``MemoryError``
after minutes of swapping, and a machine with more memory reads larger files. An allocation that still fails while
a file is read (other processes took the memory meanwhile, or a file that expands more than its kind does) ends
the same way (:func:`reading`).
"""

from __future__ import annotations

import os
import resource
from collections.abc import Iterator
from contextlib import contextmanager

from kvlab.errors import KvlabError
from kvlab.units import fmt_bytes

#: bytes of memory a reader holds per byte of its file (measured: trace 27, snapshot 9, log 2.5, config.json ~10)
EXPANSION = {"trace": 32, "snapshot": 16, "log": 4, "config": 16}
WHAT = {"trace": "Mooncake-format trace", "snapshot": "memory snapshot", "log": "server log",
        "config": "model config"}


class InputTooLargeError(KvlabError, ValueError):
    """An input file too large to read in the memory this machine has; the message names the file, its size
    and the limit."""


def _meminfo_available() -> int | None:
    """``MemAvailable`` of /proc/meminfo (what can be allocated without swapping), else the free pages
    ``os.sysconf`` reports; None where neither is known."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return None


def _cgroup_limit() -> int | None:
    """The memory cap of this process's cgroup (v2 ``memory.max``; a container's limit), or None."""
    try:
        with open("/sys/fs/cgroup/memory.max", encoding="ascii") as f:
            text = f.read().strip()
        return None if text == "max" else int(text)
    except (OSError, ValueError):
        return None


def _address_space_left() -> int | None:
    """What ``RLIMIT_AS`` (``ulimit -v``) leaves this process to map, or None without such a limit."""
    soft, _ = resource.getrlimit(resource.RLIMIT_AS)
    if soft == resource.RLIM_INFINITY:
        return None
    try:
        with open("/proc/self/statm", encoding="ascii") as f:
            used = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        used = 0
    return max(soft - used, 0)


def available_memory() -> int | None:
    """Bytes this process can still allocate: the least of the machine's available memory, its cgroup's cap and
    what its address-space limit leaves; None when none of them is known (then no file is refused for its size)."""
    known = [n for n in (_meminfo_available(), _cgroup_limit(), _address_space_left()) if n is not None]
    return min(known) if known else None


def size_limit(kind: str) -> int | None:
    """The largest file of ``kind`` (a key of :data:`EXPANSION`) kvlab reads on this machine now, or None."""
    available = available_memory()
    return None if available is None else available // EXPANSION[kind]


def check_size(path: str | os.PathLike, name: str, kind: str, size: int | None = None) -> None:
    """Refuse ``path`` (called ``name`` in the message: the file, or the flag and the file) when its size times
    its reader's expansion factor exceeds the memory available now. ``size``: its size, when already known."""
    size = os.stat(path).st_size if size is None else size
    available = available_memory()
    if available is None or size * EXPANSION[kind] <= available:
        return
    limit = available // EXPANSION[kind]
    raise InputTooLargeError(
        f"{name}: {fmt_bytes(size)} ({size:,} bytes), more than the {fmt_bytes(limit)} kvlab reads on this machine "
        f"now: reading a {WHAT[kind]} takes about {EXPANSION[kind]} times its size in memory, and "
        f"{fmt_bytes(available)} is available; give a smaller file, or run where more memory is free")


@contextmanager
def reading(path: str | os.PathLike, name: str | None = None, kind: str | None = None) -> Iterator[None]:
    """Read ``path`` inside this block: with ``kind``, first :func:`check_size`; a ``MemoryError`` raised inside
    becomes an :class:`InputTooLargeError` naming the file (``name``, default the path) and its size."""
    name = str(path) if name is None else name
    if kind is not None:
        check_size(path, name, kind)
    try:
        yield
    except MemoryError:
        raise _out_of_memory(path, name) from None


def _out_of_memory(path: str | os.PathLike, name: str) -> InputTooLargeError:
    try:
        shown = f" of {fmt_bytes(os.stat(path).st_size)}"
    except OSError:
        shown = ""
    return InputTooLargeError(f"{name}: ran out of memory while reading this file{shown}; give a smaller file, or "
                              "run where more memory is free")
