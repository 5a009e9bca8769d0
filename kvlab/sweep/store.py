"""Sweep rows on disk, written as each point finishes, so that an interrupted sweep loses at most the row in flight.

CSV (``.csv``): a header, then one line per row, each appended with a single ``write`` to a file opened for
appending. A kill can at worst leave a last line without its newline: reading drops it (that point runs
again) and the next append cuts it off first. Earlier lines are never rewritten while the sweep runs; when it
completes, the file is rewritten once in grid order (to a temporary file, then ``os.replace``: the old file
stays whole until the new one is).

Parquet (``.parquet``/``.pq``, needs pyarrow: ``pip install 'kvlab[parquet]'``): a Parquet file cannot be
appended to, so after each row the whole table (in grid order) is written to a temporary file that replaces
the old one; a kill leaves the previous table whole.

An existing file is only ever added to when its columns are exactly a sweep's (:data:`COLUMNS`); anything
else (another program's CSV, a Parquet file with other columns, something that is not a table) is refused.
"""

from __future__ import annotations

import csv
import io
import math
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from kvlab.sweep.grid import SweepError
from kvlab.sweep.point import TIMING_COLUMNS, TOTAL_COLUMNS

PARAM_COLUMNS = ("source", "seed", "eviction", "policy", "page_size", "max_running", "kv_pages", "kv_tokens")
COLUMNS = PARAM_COLUMNS + TOTAL_COLUMNS + TIMING_COLUMNS
FLOAT_COLUMNS = frozenset({"hit_rate", "simulated_s", "output_tokens_per_s", "wall_s"})
TEXT_COLUMNS = frozenset({"source", "eviction", "policy"})
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


def _replace_atomically(path: Path, write: Callable[[Path], None]) -> None:
    """``write(tmp)`` then rename over ``path``: readers (and a kill) see the old file or the new one, whole."""
    tmp = path.with_name(f".{path.name}.kvlab-tmp")
    write(tmp)
    with open(tmp, "rb+") as f:
        os.fsync(f.fileno())
    os.replace(tmp, path)


class RowFile:
    """A sweep's output file; ``rows`` are those already in it when opened (the points a rerun skips)."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)
        if self.path.is_dir():
            raise SweepError(f"--out {self.path}: is a folder; give a .csv or .parquet file")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.rows: list[dict] = self._read() if self.path.exists() and self.path.stat().st_size else []

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
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
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
        def write(tmp: Path) -> None:
            tmp.write_bytes(self._line(COLUMNS) + b"".join(self._line([r[c] for c in COLUMNS]) for r in rows))

        _replace_atomically(self.path, write)
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
        _replace_atomically(self.path, lambda tmp: pa.parquet.write_table(table, tmp))


def open_row_file(path: str | os.PathLike) -> RowFile:
    """The output file for ``path``, by extension (``.csv``, ``.parquet``, ``.pq``), its rows read."""
    suffix = Path(path).suffix.lower()
    if suffix in CSV_SUFFIXES:
        return CsvRowFile(path)
    if suffix in PARQUET_SUFFIXES:
        _pyarrow()
        return ParquetRowFile(path)
    raise SweepError(f"--out {path}: unknown format {suffix or '(no extension)'!r}; use a .csv or .parquet file")
