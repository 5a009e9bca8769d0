"""Mooncake-format JSONL traces: load (with token synthesis), write, describe, and generate realistic ones.

The format (``kvcache-ai/Mooncake: FAST25-release/traces/*.jsonl``; SGLang reads it in
``sglang/benchmark/datasets/mooncake.py``) is one JSON object per line::

    {"timestamp": 27482, "input_length": 6955, "output_length": 52, "hash_ids": [46, 47, ..., 2353, 2354]}

- ``timestamp``: arrival in milliseconds from the trace origin (int);
- ``input_length`` / ``output_length``: prompt tokens / generated tokens;
- ``hash_ids``: one id per 512-token block of the prompt, the last block possibly partial, so
  ``len(hash_ids) == div_ceil(input_length, 512)``. The ids are chained (a block's id depends on every block
  before it, like SGLang/vLLM page hashes) and remapped to small ints: equal ids mean equal prefixes.

Token synthesis. Block ``h`` becomes ``range(h * block_size, (h + 1) * block_size)``, the last block truncated so
the prompt has exactly ``input_length`` tokens. So equal ids give equal blocks (a partial block is a prefix of the
full one), different ids give blocks that differ at every position, the first included; with a KV page size of
``block_size``, page ``i`` of a prompt *is* block ``hash_ids[i]``, and a token-level radix cache sees exactly the
trace's block hits, never a spurious match inside a block. Each block is one ``range`` object shared by every
request that names it (O(1) memory); ``Request.block_hashes`` keeps the ids for block-keyed schedulers.
These token ids run far past any vocabulary (block 100,000 starts at 51,200,000): they are identities for
caching, and nothing in kvlab embeds them. (SGLang instead writes text, ``f"{hash_id}"`` + 128 x ``" hi"`` per
block, and re-tokenises it, so its prompt lengths drift from ``input_length``.)

Loading never materialises prompts: a 12,000-request trace of ~12k-token prompts loads in about 0.2 s and
holds ~45 MiB (``benchmarks/make_mooncake_trace.py --benchmark`` prints the figures). :func:`load_trace` reads a
well-formed file column-wise (:func:`_load_well_formed`) and anything else line by line, which names the first
bad line.

The record, its error and :func:`trace_stats` live in ``kvlab.workloads.mooncake_records``, the generator
(:func:`generate_trace`) in ``kvlab.workloads.mooncake_generate``; both are re-exported here.
"""

from __future__ import annotations

import gc
import json
import operator
import os
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from itertools import accumulate, chain, repeat
from pathlib import Path
from typing import Any

from kvlab.input_limits import reading
from kvlab.units import div_ceil
from kvlab.workloads.bounds import MAX_LENGTH, check_size, lengths_size
from kvlab.workloads.mooncake_generate import CONVERSATION_TRACE_SHAPE as CONVERSATION_TRACE_SHAPE  # re-exported
from kvlab.workloads.mooncake_generate import generate_trace as generate_trace  # re-exported
from kvlab.workloads.mooncake_records import MOONCAKE_BLOCK_SIZE as MOONCAKE_BLOCK_SIZE  # re-exported
from kvlab.workloads.mooncake_records import MooncakeRecord as MooncakeRecord  # re-exported
from kvlab.workloads.mooncake_records import TraceFormatError as TraceFormatError  # re-exported
from kvlab.workloads.mooncake_records import TraceStats as TraceStats  # re-exported
from kvlab.workloads.mooncake_records import check_block_size
from kvlab.workloads.mooncake_records import trace_stats as trace_stats  # re-exported
from kvlab.workloads.request import Request, TokenSequence

_FIELDS = ("timestamp", "input_length", "output_length", "hash_ids")
_TOKEN_LIMIT = 2**63
PathLike = str | Path


# ---------------------------------------------------------------------------------------------------------
# validation


def _show(value: Any) -> str:
    try:
        text = json.dumps(value)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


# Upper bounds on a record's numbers: a timestamp within ~300 years of the trace's start, and no request longer
# than 10M tokens (MAX_LENGTH, kvlab.workloads.bounds: the longest context any model offers), so no record asks for
# unbounded work or overflows; the whole trace is held to the same bounds as a generated workload (check_size)
MAX_TIMESTAMP_MS = 10 ** 13


def _int_field(where: str, name: str, value: Any, minimum: int, unit: str = "", maximum: int = MAX_LENGTH) -> int:
    if type(value) is not int or value < minimum:
        raise TraceFormatError(where, f"field {name!r} must be an integer >= {minimum}{unit}, got {_show(value)}",
                               name)
    if value > maximum:
        raise TraceFormatError(where, f"field {name!r} must be at most {maximum:,}{unit}, got {_show(value)}", name)
    return value


class _DuplicateKey(ValueError):
    def __init__(self, key: str, first: Any, second: Any):
        super().__init__(key)
        self.key, self.first, self.second = key, first, second


def _no_duplicate_keys(pairs: list) -> dict:
    """``object_pairs_hook``: a JSON object as a dict, refusing a key given twice (``json`` keeps the last one
    silently). :func:`iter_records` pays for it only on a line with more colons than keys: every key of every
    object has one colon, so a line whose colon count is its key count (every line kvlab or Mooncake writes) has
    no key twice."""
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: dict = {}
        for key, value in pairs:
            if key in seen:
                raise _DuplicateKey(key, seen[key], value)
            seen[key] = value
    return obj


_STRICT_DECODER = json.JSONDecoder(object_pairs_hook=_no_duplicate_keys)


def _fast_record(obj: Any, block_size: int) -> MooncakeRecord | None:
    """The record of a decoded line that is a valid one (the common case), checked with inline tests and C-level
    scans of ``hash_ids``; None for anything else, which :func:`_parse_record` then checks and names."""
    if type(obj) is not dict:
        return None
    ts, n_in, n_out, ids = (obj.get("timestamp"), obj.get("input_length"), obj.get("output_length"),
                            obj.get("hash_ids"))
    if not (type(ts) is int and type(n_in) is int and type(n_out) is int and type(ids) is list
            and 0 <= ts <= MAX_TIMESTAMP_MS and 1 <= n_in <= MAX_LENGTH and 0 <= n_out <= MAX_LENGTH
            and len(ids) == -(-n_in // block_size)):
        return None
    if set(map(type, ids)) != {int} or min(ids) < 0 or max(ids) > _TOKEN_LIMIT // block_size - 1:
        return None  # n_in >= 1, so ids is not empty
    return MooncakeRecord(ts, n_in, n_out, tuple(ids))


def _parse_record(obj: Any, where: str, block_size: int) -> MooncakeRecord:
    """Check one decoded JSON value (or a mapping given in memory); extra keys are ignored."""
    if not isinstance(obj, Mapping):
        kind = {list: "array", str: "string", bool: "boolean", type(None): "null"}.get(type(obj), "number")
        raise TraceFormatError(where, f"expected a JSON object, got {kind}")
    for name in _FIELDS:
        if name not in obj:
            raise TraceFormatError(where, f"missing field {name!r}", name)
    ts = _int_field(where, "timestamp", obj["timestamp"], 0, " (milliseconds)", MAX_TIMESTAMP_MS)
    n_in = _int_field(where, "input_length", obj["input_length"], 1)
    n_out = _int_field(where, "output_length", obj["output_length"], 0)
    ids = obj["hash_ids"]
    if not isinstance(ids, (list, tuple)):
        raise TraceFormatError(where, f"field 'hash_ids' must be a list of integers, got {_show(ids)}", "hash_ids")
    max_id = _TOKEN_LIMIT // block_size - 1  # so every synthesised token id fits int64
    if (ids and set(map(type, ids)) != {int}) or (ids and not (min(ids) >= 0 and max(ids) <= max_id)):
        i, h = next((i, h) for i, h in enumerate(ids) if type(h) is not int or not 0 <= h <= max_id)
        raise TraceFormatError(where, f"field 'hash_ids' must be a list of integers in [0, {max_id}]; "
                                      f"element {i} is {_show(h)}", "hash_ids")
    need = div_ceil(n_in, block_size)
    if len(ids) != need:
        raise TraceFormatError(where, f"field 'hash_ids' has {len(ids)} ids but input_length {n_in} needs "
                                      f"div_ceil({n_in}, {block_size}) = {need}", "hash_ids")
    return MooncakeRecord(ts, n_in, n_out, tuple(ids))


def _coerce(record: Any, where: str, block_size: int) -> MooncakeRecord:
    if isinstance(record, MooncakeRecord):
        record = record.to_dict()
    return _parse_record(record, where, block_size)


# ---------------------------------------------------------------------------------------------------------
# reading and writing


def iter_records(path: PathLike, *, block_size: int = MOONCAKE_BLOCK_SIZE) -> Iterator[MooncakeRecord]:
    """The records of a trace file, in file order; blank lines are skipped (as SGLang does).

    Raises :class:`TraceFormatError` naming ``<path>:<line>`` and the field for the first bad line, and naming
    ``<path>`` for a file with no record (0 bytes, or only blank lines): a run on no requests would report
    zeros that look like results.
    """
    check_block_size(block_size)
    _check_path(path)
    lineno = found = 0
    for lineno, obj in _decode_lines(path):
        if obj is _BLANK:
            continue
        found += 1
        yield _fast_record(obj, block_size) or _parse_record(obj, f"{path}:{lineno}", block_size)
    if not found:
        plural = "s" if lineno > 1 else ""
        what = "the file is 0 bytes" if lineno == 0 else f"{lineno} blank line{plural}, nothing else"
        raise TraceFormatError(str(path), f"empty trace: no requests ({what}); a Mooncake-format trace has one "
                                          "JSON object per line")


def _check_path(path: PathLike) -> None:
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: trace file not found")
    if os.path.isdir(path):
        raise IsADirectoryError(f"{path}: is a directory, not a Mooncake-format JSONL trace file")


_BLANK = object()  # what _decode_lines gives for a blank line
_DECODER = json.JSONDecoder()  # json.loads' own settings
_WHITESPACE = " \t\n\r"  # JSON's


def _decode_lines(path: PathLike) -> Iterator[tuple[int, Any]]:
    """(line number, decoded JSON value or ``_BLANK``) for each line of ``path``; raises :class:`TraceFormatError`
    naming ``<path>:<line>`` for a line that is not one JSON value.

    The fast path reads the file as one UTF-8 string and runs the decoder's scanner on each line (what
    ``json.loads`` does, less its per-call checks: a third of the time); any line the scanner does not read whole,
    and a file that is not UTF-8, go through ``json.loads`` line by line, whose error names the line and column.
    """
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        yield from _decode_slowly(path, _lines(data, b"\n"), 1)
        return
    lines = _lines(text, "\n")
    scan, ws = _DECODER.scan_once, _WHITESPACE
    for i, line in enumerate(lines):
        body = line.strip(ws)
        if not body:
            yield i + 1, _BLANK
            continue
        try:
            obj, end = scan(body, 0)
        except (StopIteration, ValueError, RecursionError):
            end = -1
        if end != len(body):  # not one JSON value: json.loads says why
            yield from _decode_slowly(path, [s.encode("utf-8", "surrogatepass") for s in lines[i:]], i + 1)
            return
        yield i + 1, _no_key_twice(obj, body, f"{path}:{i + 1}")


def _no_key_twice(obj: Any, line: str | bytes, where: str) -> Any:
    """``obj`` (``line`` decoded), refused naming ``where`` if one of its keys is given twice. A well-formed record
    has one colon per key, so only a line with more colons than keys is decoded again, by the checking decoder."""
    if type(obj) is dict and line.count(":" if isinstance(line, str) else b":") != len(obj):
        try:
            _STRICT_DECODER.decode(line if isinstance(line, str) else line.decode("utf-8-sig"))
        except _DuplicateKey as e:
            raise TraceFormatError(where, f"key {_show(e.key)} given twice ({_show(e.first)}, then "
                                          f"{_show(e.second)}): which one is meant is unclear", e.key) from None
    return obj


def _lines(text: str | bytes, newline: str | bytes) -> list:
    """``text``'s lines, as a file reads them: a final line end ends the last line, it starts none."""
    lines = text.split(newline)
    if not lines[-1]:
        lines.pop()
    return lines


def _decode_slowly(path: PathLike, raw_lines: list[bytes], first_lineno: int) -> Iterator[tuple[int, Any]]:
    """:func:`_decode_lines` one ``json.loads`` per line (``raw_lines`` numbered from ``first_lineno``)."""
    for lineno, raw in enumerate(raw_lines, first_lineno):
        if not raw.strip():
            yield lineno, _BLANK
            continue
        where = f"{path}:{lineno}"
        try:
            line = raw.rstrip(b"\r\n")  # so an error's column is on this line
            obj = _no_key_twice(json.loads(line), line, where)
        except json.JSONDecodeError as e:
            raise TraceFormatError(where, f"not valid JSON: {e.msg} (column {e.colno})") from None
        except ValueError as e:  # bytes that are not UTF-8
            raise TraceFormatError(where, f"not valid JSON: {e}") from None
        except RecursionError:
            raise TraceFormatError(where, "not a trace record: JSON nested too deeply to read") from None
        yield lineno, obj


def read_records(path: PathLike, *, block_size: int = MOONCAKE_BLOCK_SIZE) -> list[MooncakeRecord]:
    """All records of a trace file, in file order (see :func:`iter_records`)."""
    return list(iter_records(path, block_size=block_size))


def load_trace(path: PathLike, *, block_size: int = MOONCAKE_BLOCK_SIZE) -> list[Request]:
    """A Mooncake trace as requests sorted by arrival (ties keep file order).

    ``arrival_time_s = timestamp / 1000`` (the trace's own origin: published traces start at 0). ``rid`` is
    ``<file stem>-<record index in file order>``; prompts are synthesised from ``hash_ids`` (module docstring).
    """
    check_block_size(block_size)
    _check_path(path)
    with _no_gc_pauses(), reading(path):  # a MemoryError names the file (kvlab.input_limits)
        fast = _load_well_formed(path, block_size, Path(path).stem)
        if fast is not None:
            return fast
        records = read_records(path, block_size=block_size)
        _check_records_size(records, str(path))
        return _to_requests(records, block_size, Path(path).stem)


def _check_records_size(records: Sequence[MooncakeRecord], where: str) -> None:
    """Refuse records beyond the simulator's bounds (kvlab.workloads.bounds), naming ``where``."""
    check_size(lengths_size([r.input_length for r in records], [r.output_length for r in records], "records"), where)


@contextmanager
def _no_gc_pauses() -> Iterator[None]:
    """The cyclic garbage collector held off while a trace loads: loading makes ~10 container objects per request
    and no reference cycle, so the collections its allocations trigger (young ones every 700 objects, older and
    full ones as those fill) walk what the load made again and again and find nothing: about a third of the load
    time. One collection still walks the new objects once after the load. Restored on the way out, errors
    included; a collector already off stays off (as ``kvlab.device.measure.automatic_gc_paused``, which this layer
    cannot import)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


_GET_FIELDS = operator.itemgetter(*_FIELDS)
_INT = {int}


def _load_well_formed(path: PathLike, block_size: int, rid_prefix: str) -> list[Request] | None:
    """:func:`load_trace`'s requests for a file of well-formed records (every file kvlab or Mooncake writes), or
    None on any doubt, for the line-by-line reader to read and name the first bad line exactly.

    Well-formed: UTF-8, one JSON object per line with no blank line and no space around it, each with valid
    fields (the checks of :func:`_fast_record`) and no key twice (one colon per key in the whole file). The
    checks run on whole columns in C-level calls (``map``, ``set``, ``min``), then one short Python loop builds
    the requests with the trusted constructors: two thirds of the time of records then requests, most of it in
    the JSON scanner, the one ``range`` per distinct block and the requests themselves."""
    with open(path, "rb") as f:
        data = f.read()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return None
    lines = _lines(text, "\n")
    try:
        objs, ends = zip(*map(_DECODER.scan_once, lines, repeat(0)))
    except (StopIteration, ValueError, RecursionError):  # a blank line, bad JSON, or nothing at all
        return None
    if (ends != tuple(map(len, lines)) or set(map(type, objs)) != {dict}
            or text.count(":") != sum(map(len, objs))):
        return None
    try:
        ts, n_in, n_out, ids = zip(*map(_GET_FIELDS, objs))
    except KeyError:
        return None
    if not (set(map(type, ts)) == set(map(type, n_in)) == set(map(type, n_out)) == _INT
            and set(map(type, ids)) == {list}
            and min(ts) >= 0 and max(ts) <= MAX_TIMESTAMP_MS and min(n_in) >= 1 and max(n_in) <= MAX_LENGTH
            and min(n_out) >= 0 and max(n_out) <= MAX_LENGTH):
        return None
    check_size(lengths_size(n_in, n_out, "records"), str(path))  # before a request is built
    n_blocks = tuple(map(len, ids))
    if n_blocks != tuple(map(operator.floordiv, map(operator.add, n_in, repeat(block_size - 1)), repeat(block_size))):
        return None
    flat = list(chain.from_iterable(ids))  # not empty: every prompt has a block
    if set(map(type, flat)) != _INT or min(flat) < 0 or max(flat) > _TOKEN_LIMIT // block_size - 1:
        return None
    # the requests: segment lists sliced from one flat list of every prompt's blocks, last blocks truncated
    top = max(flat)
    if top < 2 * len(flat):  # ids numbered from 0 up, as published traces and generate_trace number them: a
        # list of every id's block (no set, no dict: half the time)
        table = list(map(range, range(0, (top + 1) * block_size, block_size),
                         range(block_size, (top + 2) * block_size, block_size)))
        segs = list(map(table.__getitem__, flat))
        del table  # the blocks of ids no prompt names go with it
    else:
        segs = list(map(_shared_blocks([flat], block_size).__getitem__, flat))
    stops = list(accumulate(n_blocks))
    full_ends = tuple(range(block_size, max(n_blocks) * block_size, block_size))
    new_seq, new_request = TokenSequence.from_segments, Request.from_checked
    out = []
    for i, (stop, n, length) in enumerate(zip(stops, n_blocks, n_in)):
        tail = length - (n - 1) * block_size
        if tail != block_size:
            segs[stop - 1] = segs[stop - 1][:tail]
        prompt = new_seq(segs[stop - n:stop], full_ends[: n - 1] + (length,))
        out.append(new_request(f"{rid_prefix}-{i}", ts[i] / 1000, prompt, n_out[i], tuple(ids[i]), block_size))
    order = sorted(range(len(out)), key=ts.__getitem__)
    return list(map(out.__getitem__, order))


def records_to_requests(records: Iterable[MooncakeRecord | Mapping], *,
                        block_size: int = MOONCAKE_BLOCK_SIZE, rid_prefix: str = "trace") -> list[Request]:
    """Like :func:`load_trace` for in-memory records (``MooncakeRecord`` or mappings with the JSON keys)."""
    check_block_size(block_size)
    checked = [_coerce(r, f"records[{i}]", block_size) for i, r in enumerate(records)]
    _check_records_size(checked, "records")
    return _to_requests(checked, block_size, rid_prefix)


def _shared_blocks(id_lists: Iterable[Sequence[int]], block_size: int) -> dict[int, range]:
    """hash id -> its full block, one shared ``range`` per distinct id in ``id_lists``, built by C-level maps (a
    Python call per block, as a ``__missing__`` hook makes, was half of a 12k-request trace's load time)."""
    ids = list(set().union(*id_lists))
    starts = list(map(operator.mul, ids, repeat(block_size)))
    return dict(zip(ids, map(range, starts, map(operator.add, starts, repeat(block_size)))))


def _to_requests(records: Sequence[MooncakeRecord], block_size: int, rid_prefix: str) -> list[Request]:
    block = _shared_blocks([rec.hash_ids for rec in records], block_size).__getitem__
    longest = max((len(rec.hash_ids) for rec in records), default=0)
    full_ends = tuple(range(block_size, longest * block_size, block_size))  # every prompt's block ends but its last
    out = []
    for i, rec in enumerate(records):
        segs = list(map(block, rec.hash_ids))
        n = len(segs)
        if rec.input_length != n * block_size:
            segs[-1] = segs[-1][: rec.input_length - (n - 1) * block_size]
        ends = full_ends[: n - 1] + (rec.input_length,)
        out.append(Request(rid=f"{rid_prefix}-{i}", arrival_time_s=rec.timestamp_ms / 1000,
                           prompt_token_ids=TokenSequence.from_segments(segs, ends), output_len=rec.output_length,
                           block_hashes=rec.hash_ids, block_size=block_size))
    order = sorted(range(len(out)), key=lambda i: records[i].timestamp_ms)
    return [out[i] for i in order]


def block_tokens(hash_id: int, *, block_size: int = MOONCAKE_BLOCK_SIZE) -> range:
    """The synthesised tokens of full block ``hash_id`` (the rule :func:`load_trace` uses)."""
    return range(hash_id * block_size, (hash_id + 1) * block_size)


def write_trace(path: PathLike, records: Iterable[MooncakeRecord | Mapping], *, overwrite: bool = False,
                block_size: int = MOONCAKE_BLOCK_SIZE) -> Path:
    """Write records as Mooncake JSONL (``\\n`` line ends, UTF-8). Every record is checked before the file is
    opened; an existing file is refused (``FileExistsError``) unless ``overwrite=True``."""
    check_block_size(block_size)
    lines = [_coerce(r, f"records[{i}]", block_size).to_json() for i, r in enumerate(records)]
    text = "".join(line + "\n" for line in lines)
    try:
        with open(path, "w" if overwrite else "x", encoding="utf-8", newline="\n") as f:
            f.write(text)
    except FileExistsError:
        raise FileExistsError(f"{path} already exists; pass overwrite=True to replace it") from None
    return Path(path)
