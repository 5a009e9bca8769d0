"""Sweep rows on disk, written as each point finishes, so that an interrupted sweep loses at most the row in flight.

CSV (``.csv``): a header, then one line per row, each appended with a single ``write`` to a file opened for
appending. A kill can at worst leave a last line without its newline: reading drops it (that point runs
again) and the next append cuts it off first. Earlier lines are never rewritten while the sweep runs; when it
completes, the file is rewritten once in grid order (to a temporary file, then ``os.replace``: the old file
stays whole until the new one is).

The temporary file has an unpredictable name and is created afresh (``tempfile.mkstemp``: ``O_EXCL``, so a
symlink or a file already there is never followed or written over), in the output's folder, with the output's
permissions. One sweep writes a file at a time: the writer holds an ``flock`` on the file (and takes it on each
replacement before it is renamed into place), so a second sweep on the same ``--out`` is refused with an error
naming the file instead of rewriting it from a stale view and losing the first one's rows.

Parquet (``.parquet``/``.pq``, needs pyarrow: ``pip install 'kvlab[parquet]'``): a Parquet file cannot be
appended to, so after each row the whole table (in grid order) is written to a temporary file that replaces
the old one; a kill leaves the previous table whole.

An existing file is only ever added to when its columns are exactly a sweep's (:data:`COLUMNS`); anything
else (another program's CSV, a Parquet file with other columns, something that is not a table) is refused.
"""

from __future__ import annotations

import contextlib
import csv
import errno
import fcntl
import io
import math
import os
import stat
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import BinaryIO

from kvlab.sweep.grid import SweepError
from kvlab.sweep.point import TIMING_COLUMNS, TOTAL_COLUMNS

PARAM_COLUMNS = ("source", "seed", "eviction", "policy", "page_size", "max_running", "kv_pages", "kv_tokens",
                 "hicache_ratio", "hicache_write_policy", "hicache_storage_backend", "hicache_storage_prefetch_policy")
COLUMNS = PARAM_COLUMNS + TOTAL_COLUMNS + TIMING_COLUMNS
FLOAT_COLUMNS = frozenset({"hicache_ratio", "hit_rate", "transfer_s", "simulated_s", "output_tokens_per_s", "wall_s"})
TEXT_COLUMNS = frozenset({"source", "eviction", "policy", "hicache_write_policy", "hicache_storage_backend",
                          "hicache_storage_prefetch_policy"})
CSV_SUFFIXES = (".csv",)
PARQUET_SUFFIXES = (".parquet", ".pq")


def column_type(name: str) -> type:
    return str if name in TEXT_COLUMNS else float if name in FLOAT_COLUMNS else int


def row_key(row: dict) -> tuple:
    """What identifies a point in a file: its grid parameters (``PARAM_COLUMNS``)."""
    return tuple(row[c] for c in PARAM_COLUMNS)


def _coerce(row: dict, where: str) -> dict:
    out = {}
    for name in COLUMNS:
        value, kind = row.get(name), column_type(name)
        try:
            if kind is str:
                if not isinstance(value, str):
                    raise ValueError
                out[name] = value
            elif kind is int:
                if isinstance(value, float) and not value.is_integer():
                    raise ValueError
                out[name] = int(value)
            else:
                out[name] = float(value)
                if math.isnan(out[name]):
                    raise ValueError
        except (TypeError, ValueError):
            shown = repr(value) if len(repr(value)) <= 60 else repr(value)[:57] + "..."
            raise SweepError(f"{where}: column {name!r} holds {shown}, not a sweep's "
                             f"{kind.__name__}; is this a kvlab sweep file?") from None
    return out


def _require_sweep_columns(path: Path, names: Sequence[str]) -> None:
    """A file is only added to when its columns are exactly a sweep's (:data:`COLUMNS`)."""
    if tuple(names) != COLUMNS:
        shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
        raise SweepError(f"--out {path}: its columns ({shown or 'none'}) are not a kvlab sweep's; "
                         f"choose another file (kvlab never writes over a file it did not make)")


def _new_file_mode(path: Path) -> int:
    """The permissions a rewrite keeps: the file's own, else what a new file gets under this process's umask."""
    try:
        return path.stat().st_mode & 0o7777
    except OSError:
        umask = os.umask(0)
        os.umask(umask)
        return 0o666 & ~umask


def refuse_links(path: str | os.PathLike) -> None:
    """Refuse an ``--out`` that is a symbolic link (to a file, a folder or nothing) or a file with other hard links:
    a sweep replaces its file when it completes, which would turn the link into a file of its own (and a dangling
    link would first have its target created wherever it points). Raises :class:`SweepError` naming the path."""
    try:
        info = os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return
    except OSError:
        return  # not readable: the checks that open the file say why
    if stat.S_ISLNK(info.st_mode):
        _refuse_link(path)
    if stat.S_ISREG(info.st_mode) and info.st_nlink > 1:
        _refuse_hard_link(path, info.st_nlink)


def _refuse_link(path) -> None:
    try:
        target = f" to {os.readlink(path)}"
    except OSError:
        target = ""
    raise SweepError(f"--out {path}: is a symbolic link{target}; kvlab writes no output through a link (it would "
                     f"replace the link with a file): give the real file's path instead")


def _refuse_hard_link(path, links: int) -> None:
    raise SweepError(f"--out {path}: has {links} hard links (the same file under other names); a sweep "
                     f"replaces its file when it completes, which would split them: give a file with one name "
                     f"(copy it first)")


def _open_own_file(path: Path, flags: int) -> int:
    """``os.open`` that never follows a link at ``path`` (``O_NOFOLLOW``) and refuses a file with other hard links
    (``fstat`` of what was opened): :func:`refuse_links`, at the moment the file is opened."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW, 0o666)
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a link, put there since the first check
            _refuse_link(path)
        raise
    links = os.fstat(fd).st_nlink
    if links > 1:
        os.close(fd)
        _refuse_hard_link(path, links)
    return fd


def _replace_atomically(path: Path, write: Callable[[BinaryIO], None], lock: bool) -> int | None:
    """``write(file)`` into a fresh temporary file beside ``path``, then rename it over ``path``: readers (and a kill)
    see the old file or the new one, whole. With ``lock``, the new file is ``flock``-ed before it takes ``path``'s
    place, and the locked descriptor is returned (the caller keeps it open for as long as it writes)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".kvlab-tmp")
    try:
        os.fchmod(fd, _new_file_mode(path))
        if lock:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a file only this process knows of: free
        with os.fdopen(os.dup(fd), "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        os.close(fd)
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if lock:
        return fd
    os.close(fd)
    return None


class RowFile:
    """A sweep's output file; ``rows`` are those already in it when opened (the points a rerun skips).

    ``write=True`` (what a sweep uses): this process becomes the file's one writer until :meth:`close` (an
    ``flock`` on it; a file that does not exist yet is created empty), and the rows are read under that lock.
    Another writer gets a :class:`SweepError` naming the file. Readers (``write=False``) take no lock."""

    _lock_fd: int | None = None
    _created = False

    def __init__(self, path: str | os.PathLike, *, write: bool = False) -> None:
        self.path = Path(path)
        refuse_links(self.path)  # before anything is created or followed
        try:
            if self.path.is_dir():
                raise SweepError(f"--out {self.path}: is a folder; give a .csv or .parquet file")
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:  # a name too long, a file on the way (kvlab sweep checks these first: check_out)
            raise SweepError(f"--out {self.path}: its folder cannot be created ({exc.strerror or exc})") from None
        if write:
            self._lock()
        try:
            self.rows: list[dict] = self._read() if self.path.exists() and self.path.stat().st_size else []
        except BaseException:
            self.close()
            raise

    def _lock(self) -> None:
        while True:
            existed = self.path.exists()
            fd = _open_own_file(self.path, os.O_RDWR | os.O_CREAT)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                os.close(fd)
                raise SweepError(f"--out {self.path}: another kvlab sweep is writing to this file; wait for it to "
                                 f"finish (then rerun to add this grid's points) or choose another --out") from None
            try:
                same = os.path.samestat(os.fstat(fd), os.lstat(self.path))
            except FileNotFoundError:
                same = False
            if same:  # not a file that a writer finishing just now replaced under our feet
                self._lock_fd, self._created = fd, not existed
                return
            os.close(fd)

    def _replace(self, write: Callable[[BinaryIO], None]) -> None:
        """Rewrite the file whole (see :func:`_replace_atomically`), keeping it locked if this is its writer."""
        fd = _replace_atomically(self.path, write, lock=self._lock_fd is not None)
        if fd is not None:
            os.close(self._lock_fd)  # the old file's lock: nobody can reach that file by its name any more
            self._lock_fd, self._created = fd, False

    def close(self) -> None:
        """Give up the writer's lock; a file this writer created and never wrote a row to is removed."""
        if self._lock_fd is None:
            return
        try:
            if self._created and os.fstat(self._lock_fd).st_size == 0:
                with contextlib.suppress(OSError):
                    if os.path.samestat(os.fstat(self._lock_fd), os.stat(self.path)):
                        os.unlink(self.path)
        finally:
            os.close(self._lock_fd)
            self._lock_fd = None

    def _read(self) -> list[dict]:
        raise NotImplementedError

    def append(self, row: dict, ordered: Callable[[], list[dict]]) -> None:
        """Make ``row`` durable; ``ordered()`` is every row so far in output order (for formats that rewrite)."""
        raise NotImplementedError

    def finish(self, rows: Sequence[dict]) -> None:
        """Rewrite the file as ``rows``, in that order."""
        raise NotImplementedError


class CsvRowFile(RowFile):
    _valid_bytes: int | None = None  # where the file's last whole line ends, while a cut line may follow it

    def _read(self) -> list[dict]:
        data = self.path.read_bytes()
        self._valid_bytes = data.rfind(b"\n") + 1  # a last line without its newline was cut by a kill: dropped
        try:
            text = data[:self._valid_bytes].decode("utf-8")
        except UnicodeDecodeError:
            raise SweepError(f"--out {self.path}: not a kvlab sweep CSV (not UTF-8 text); choose another file") from None
        lines = list(csv.reader(io.StringIO(text, newline="")))
        _require_sweep_columns(self.path, lines[0] if lines else ())
        rows = []
        for number, values in enumerate(lines[1:], start=2):
            if len(values) != len(COLUMNS):
                raise SweepError(f"--out {self.path}:{number}: {len(values)} fields, a sweep row has {len(COLUMNS)}")
            rows.append(_coerce(dict(zip(COLUMNS, values)), f"--out {self.path}:{number}"))
        return rows

    @staticmethod
    def _line(values: Sequence) -> bytes:
        buffer = io.StringIO()
        csv.writer(buffer, lineterminator="\n").writerow(values)
        return buffer.getvalue().encode("utf-8")

    def append(self, row: dict, ordered: Callable[[], list[dict]]) -> None:
        fd = _open_own_file(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        try:
            line = self._line([row[c] for c in COLUMNS])
            if os.fstat(fd).st_size == 0:
                line = self._line(COLUMNS) + line
            elif self._valid_bytes is not None:
                os.ftruncate(fd, self._valid_bytes)  # drop a half-written last line before adding to the file
            self._valid_bytes = None
            os.write(fd, line)  # one write: the whole line (with the header, the first time) or none of it
        finally:
            os.close(fd)

    def finish(self, rows: Sequence[dict]) -> None:
        self._replace(lambda f: f.write(self._line(COLUMNS) + b"".join(self._line([r[c] for c in COLUMNS])
                                                                        for r in rows)))
        self._valid_bytes = None


def _pyarrow():
    try:
        import pyarrow
        import pyarrow.parquet
    except ImportError:
        raise SweepError("Parquet output needs pyarrow: pip install 'kvlab[parquet]' (or write a .csv)") from None
    return pyarrow


class ParquetRowFile(RowFile):
    def _read(self) -> list[dict]:
        pa = _pyarrow()
        try:
            table = pa.parquet.read_table(self.path)
        except (pa.ArrowInvalid, OSError) as exc:
            raise SweepError(f"--out {self.path}: not a readable Parquet file ({exc}); choose another file") from None
        _require_sweep_columns(self.path, table.column_names)
        return [_coerce(r, f"--out {self.path} row {i}") for i, r in enumerate(table.to_pylist())]

    @staticmethod
    def schema():
        pa = _pyarrow()
        kinds = {str: pa.string(), int: pa.int64(), float: pa.float64()}
        return pa.schema([(c, kinds[column_type(c)]) for c in COLUMNS])

    def append(self, row: dict, ordered: Callable[[], list[dict]]) -> None:
        self.finish(ordered())

    def finish(self, rows: Sequence[dict]) -> None:
        pa = _pyarrow()
        table = pa.Table.from_pylist([{c: r[c] for c in COLUMNS} for r in rows], schema=self.schema())
        self._replace(lambda f: pa.parquet.write_table(table, f))


def open_row_file(path: str | os.PathLike, *, write: bool = False) -> RowFile:
    """The output file for ``path``, by extension (``.csv``, ``.parquet``, ``.pq``), its rows read; ``write=True``
    makes this process its one writer until ``close()`` (see :class:`RowFile`)."""
    suffix = Path(path).suffix.lower()
    if suffix in CSV_SUFFIXES:
        return CsvRowFile(path, write=write)
    if suffix in PARQUET_SUFFIXES:
        _pyarrow()
        return ParquetRowFile(path, write=write)
    raise SweepError(f"--out {path}: unknown format {suffix or '(no extension)'!r}; use a .csv or .parquet file")
