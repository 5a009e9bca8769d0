"""Loading an allocator snapshot's pickle without running code from it: plain data only, a bound on the objects a
small file may build, and a stack deep enough for the tuples it nests (``load_snapshot_pickle``)."""

from __future__ import annotations

import os
import pickle
import stat
import sys
from collections.abc import Callable
from typing import Any

from kvlab.device.snapshot_schema import SnapshotError, shown_value, snapshot_error
from kvlab.input_limits import check_size, reading

# The objects a pickle may build per byte of its file: the real and generated snapshots build 0.02 to 0.15 (dense
# events without stacks), a crafted pickle of empty dicts 0.5 (40 M of them took 3.7 GB). Small files get a floor.
PICKLE_OBJECTS_PER_BYTE = 0.25
PICKLE_OBJECTS_FLOOR = 1_048_576  # 2^20 objects (a count, not bytes)
_OBJECTS_PER_BYTE_AT_MOST = 2  # what one byte of a pickle can build: an opcode of one byte makes one object


class _SnapshotUnpickler(pickle.Unpickler):
    """Unpickles plain data only: a pickle that names any global or persistent id is refused.

    ``torch.cuda.memory._dump_snapshot`` is ``pickle.dump(torch.cuda.memory._snapshot(), f)`` (default
    protocol, 4 or 5): dicts, lists, tuples, str, int, float, bool and None, each with its own opcode, so
    a real snapshot names no global at all (the shipped example and three snapshots recorded on real GPUs
    with torch 2.6 and 2.9 name none; tests/device/test_snapshot_safety.py). A global is how a pickle
    reaches code (``os.system``, ``builtins.eval``, a class's ``__reduce__``), so none is admitted: a
    plain ``pickle.load`` would run it while reading the file.
    """

    def __init__(self, file, source: str):
        super().__init__(file)
        self._source = source

    def find_class(self, module: str, name: str):  # GLOBAL, STACK_GLOBAL, INST and EXT* opcodes land here
        raise SnapshotError(
            f"{self._source}: refused global {module}.{name}: not a torch memory snapshot, which holds only plain "
            "data (dict, list, tuple, str, int, float, bool, None); a plain pickle.load could run code from this file"
        )

    def persistent_load(self, pid):
        raise SnapshotError(
            f"{self._source}: refused persistent id {shown_value(pid)}: not a torch memory snapshot, which has none "
            "(torch.save checkpoints have them: read those with torch.load(weights_only=True))"
        )


class _BoundedPickleInput:
    """A pickle's bytes as the file the C unpickler reads, which asks for more each time its buffer runs dry
    (every frame of 64 KiB, or 128 KiB without frames): each time, the objects built so far (the process's
    allocated blocks, ``sys.getallocatedblocks``) plus the most the bytes it asks for can build must stay within
    :attr:`bound`, or the load stops there with a :class:`SnapshotError` naming the bound. So a small file cannot
    build tens of millions of objects before the snapshot is even checked (issue 37: 3.7 GB and 17 s)."""

    def __init__(self, data: bytes, source: str):
        self._bytes, self._data, self._pos, self._source = data, memoryview(data), 0, source
        self.bound = max(PICKLE_OBJECTS_FLOOR, int(len(data) * PICKLE_OBJECTS_PER_BYTE))
        self._start = sys.getallocatedblocks()

    def _take(self, n: int | None, *, advance: bool = True) -> bytes:
        end = len(self._data) if n is None or n < 0 else min(self._pos + n, len(self._data))
        built = sys.getallocatedblocks() - self._start
        if built + (end - self._pos) * _OBJECTS_PER_BYTE_AT_MOST > self.bound:
            raise snapshot_error(self._source, "", f"the pickle built {built:,} objects from its first {self._pos:,} bytes "
                        f"and could build more than the {self.bound:,} kvlab allows a file of {len(self._data):,} "
                        f"bytes ({PICKLE_OBJECTS_PER_BYTE:g} per byte; a torch snapshot builds under 0.15): refused "
                        "before the rest is loaded")
        chunk = bytes(self._data[self._pos:end])
        if advance:
            self._pos = end
        return chunk

    def read(self, n: int = -1) -> bytes:
        return self._take(n)

    def peek(self, n: int = 0) -> bytes:
        return self._take(max(n, 1), advance=False)

    def readinto(self, buffer) -> int:
        chunk = self._take(len(buffer))
        buffer[:len(chunk)] = chunk
        return len(chunk)

    def readline(self) -> bytes:
        newline = self._bytes.find(b"\n", self._pos)
        return self._take(None if newline < 0 else newline + 1 - self._pos)


def load_snapshot_pickle(path: str | os.PathLike, then: Callable[[Any], Any] | None = None) -> Any:
    """The object in a ``_dump_snapshot`` pickle, read without running code from it.

    Only plain data is admitted (see :class:`_SnapshotUnpickler`); a pickle that names a global or a
    persistent id raises :class:`SnapshotError` naming the file and the refused ``module.name``, and
    nothing in it has run. A file too large for the memory this machine has is refused before it is read
    (:mod:`kvlab.input_limits`), and a pickle that builds more objects than its size explains is refused while it
    loads (:class:`_BoundedPickleInput`). Other unreadable content raises :class:`SnapshotError` too (not a
    pickle file). ``then``: called on the object, where the object's nesting cannot overflow the stack
    (:func:`_where_deep_tuples_fit`); its result is returned."""
    source = str(path)
    with open(path, "rb") as f, reading(path, source):
        status = os.fstat(f.fileno())
        if not stat.S_ISREG(status.st_mode):
            raise snapshot_error(source, "", "not a regular file (a FIFO, socket or device); give the snapshot file")
        check_size(path, source, "snapshot", status.st_size)
        data = f.read()  # a regular file of a known size that fits in memory
        try:  # from memory: a length field larger than the file (FRAME, BINBYTES8) reads short, or fails to allocate
            def load():
                obj = _SnapshotUnpickler(_BoundedPickleInput(data, source), source).load()
                return obj if then is None else then(obj)

            return _where_deep_tuples_fit(load, data)
        except SnapshotError:
            raise
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, ImportError, IndexError,
                KeyError, OverflowError, RecursionError, MemoryError) as exc:
            raise snapshot_error(source, "", f"not a pickle file ({type(exc).__name__}: {str(exc)[:200]})") from None


_MAIN_STACK_TUPLES = 50_000  # tuples nested in one another that hashing one on the main thread's 8 MiB stack takes
_STACK_PER_TUPLE = 128  # bytes of C stack per level of hash(): 150,000 levels overflowed 8 MiB
_TUPLE_OPCODES = (b"\x85", b"\x86", b"\x87", b"t")  # TUPLE1, TUPLE2, TUPLE3, TUPLE: one level each at most


def _where_deep_tuples_fit(call: Callable[[], Any], data: bytes) -> Any:
    """``call()``, where hashing the most deeply nested tuple the pickle ``data`` can build cannot overflow the C
    stack: ``hash()`` of a tuple recurses into its items in C, below Python's recursion limit, so a tuple nested
    150,000 deep as a dict key crashed the process while it loaded (a segmentation fault, not an error). Each
    level takes a tuple opcode, so their count bounds the depth: under :data:`_MAIN_STACK_TUPLES` (a real
    snapshot of 2 MB has 3,500 of those bytes) here, else in a thread whose stack holds that depth (reserved
    address space, used only as deep as the tuples go)."""
    depth = sum(map(data.count, _TUPLE_OPCODES))
    if depth < _MAIN_STACK_TUPLES:
        return call()
    import threading

    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["value"] = call()
        except BaseException as exc:  # handed to the caller's thread as it is
            outcome["error"] = exc

    previous = threading.stack_size(-(-(depth * _STACK_PER_TUPLE + (16 << 20)) // 65536) * 65536)
    try:
        worker = threading.Thread(target=run, name="kvlab-snapshot-load", daemon=True)  # Ctrl-C ends the process
        worker.start()
    finally:
        threading.stack_size(previous)
    worker.join()
    if "error" in outcome:
        raise outcome["error"]
    return outcome["value"]
