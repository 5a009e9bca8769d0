"""Read a server's runtime lines (SGLang's Prefill / Decode / retraction lines, vLLM's periodic metrics and
preemption warnings) from a log, one line at a time.

The file is never held whole: each step keeps a few numbers in typed columns (``array``, about 100 bytes a
step), so a million-line log reads in seconds (benchmarks/bench_runtime_log.py). Every line is accounted for:
a runtime line read (``steps``, ``events``), a runtime line kvlab could not read (``skipped``, with file:line
and why; the rest of the log is still read), or another line (``other_lines``, counted, the first few named).
"""

from __future__ import annotations

import math
from array import array
from collections import Counter
from dataclasses import dataclass, field
from datetime import date
from pathlib import Path

from kvlab.serving.runtime import formats as F
from kvlab.serving.sglang_log import MESSAGES, LogError

COLUMNS = ("new_seq", "new_token", "cached_token", "usage", "used_tokens", "running", "queue", "prefill_tput",
           "gen_tput", "logged_hit_rate")
KINDS = ("prefill", "decode", "vllm")
_KIND_INDEX = {k: i for i, k in enumerate(KINDS)}
MAX_NOTED = 20  # skipped lines and other lines named in full; the rest counted
MAX_UNKNOWN = 50  # distinct unknown field names kept
_POOL_SGLANG = MESSAGES["tokens"][1]  # the start-up reader's own pattern for max_total_num_tokens=N
_POOL_VLLM = __import__("re").compile(r"GPU KV cache size: (\d{1,3}(?:,\d{3})+|\d+) tokens")


@dataclass
class Event:
    """A retraction (SGLang) or preemption (vLLM) line."""

    kind: str  # "retract" | "preempt"
    line: int
    t: float  # seconds from the log's first timestamp (nan without one)
    rank: str
    count: int  # requests retracted by this line (1 for a vLLM preemption)
    ratio_before: float | None = None
    ratio_after: float | None = None
    total: int | None = None  # vLLM's cumulative count, where printed

    def to_json(self) -> dict:
        out = {"kind": self.kind, "line": self.line, "t_s": None if math.isnan(self.t) else self.t,
               "rank": self.rank, "count": self.count}
        if self.ratio_before is not None:
            out["new_token_ratio"] = [self.ratio_before, self.ratio_after]
        if self.total is not None:
            out["cumulative"] = self.total
        return out


@dataclass
class RuntimeLog:
    path: str
    engine: str | None = None  # "sglang" | "vllm" | None (no runtime line)
    n_lines: int = 0
    kind: array = field(default_factory=lambda: array("b"))  # index into KINDS
    line: array = field(default_factory=lambda: array("l"))
    t: array = field(default_factory=lambda: array("d"))
    rank: array = field(default_factory=lambda: array("h"))  # index into ranks
    cols: dict = field(default_factory=lambda: {c: array("d") for c in COLUMNS})  # nan: not printed
    ranks: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    skipped: list[tuple[int, str]] = field(default_factory=list)  # (line, why), the first MAX_NOTED
    n_skipped: int = 0
    cut_lines: list[int] = field(default_factory=list)  # read, but their last item was cut off
    unknown_fields: Counter = field(default_factory=Counter)
    unknown_first: dict = field(default_factory=dict)  # field name -> first line
    other_lines: int = 0
    other_examples: list[tuple[int, str]] = field(default_factory=list)
    t0: float = 0.0  # the first stamped runtime line's time: ``t`` minus this is seconds from it
    pool_tokens: int | None = None  # from a start-up line in the same log
    pool_line: int | None = None
    vllm_hit: dict = field(default_factory=dict)  # V0's separate "Prefix cache hit rate: GPU: x%" by line

    @property
    def n_steps(self) -> int:
        return len(self.line)

    @property
    def has_runtime(self) -> bool:
        """A runtime line read, or one kvlab could not read (a partial reading names it)."""
        return bool(self.n_steps or self.events or self.n_skipped)

    def where(self, line: int) -> str:
        return f"{self.path}:{line}"


class _Clock:
    """Seconds from a line's timestamp; a time of day alone rolls to the next day when it goes back > 12 h."""

    def __init__(self):
        self.day = 0
        self.last = None
        self.cache: dict = {}
        self.prefixes: dict = {}  # prefix -> (seconds, rank label), for prefixes with a dated stamp

    def where(self, prefix: str) -> tuple[float, str]:
        """(seconds, rank label) of a message's prefix; a prefix with a date is read once."""
        hit = self.prefixes.get(prefix)
        if hit is not None:
            return hit
        t, rank = self.seconds(prefix), rank_label(prefix)
        m = F.STAMP.search(prefix)
        if m and m.group("mo") is not None:
            if len(self.prefixes) > 4096:
                self.prefixes.clear()
            self.prefixes[prefix] = (t, rank)
        return t, rank

    def seconds(self, prefix: str) -> float:
        m = F.STAMP.search(prefix)
        if not m:
            return math.nan
        y, mo, d = m.group("y"), m.group("mo"), m.group("d")
        sod = int(m.group("h")) * 3600 + int(m.group("mi")) * 60 + int(m.group("s"))
        frac = m.group("frac")
        sod += int(frac) / 10 ** len(frac) if frac else 0.0
        if mo is None:  # time of day alone
            if self.last is not None and sod < self.last - 43200:
                self.day += 1
            self.last = sod
            return self.day * 86400.0 + sod
        key = (y, mo, d)
        if key not in self.cache:
            try:
                self.cache[key] = date(int(y or 2000), int(mo), int(d)).toordinal()
            except ValueError:
                return math.nan
        return self.cache[key] * 86400.0 + sod


def rank_label(prefix: str) -> str:
    """The rank tag just before the message: ``[... DP1 TP0]`` -> "DP1 TP0", ``[gpu_id=2]`` -> "gpu_id=2";
    none -> ""."""
    m = F.RANK_TAG.search(prefix)
    if not m:
        return ""
    parts = [p.group(0) for p in F.RANK_PART.finditer(m.group(1))]
    return " ".join(parts)


def read_runtime_log(path: str | Path) -> RuntimeLog:
    """Read the runtime lines of the log at ``path``, streaming; a file kvlab cannot open is a LogError."""
    path = Path(path)
    try:
        f = open(path, encoding="utf-8", errors="replace")  # noqa: SIM115 - closed below
    except (FileNotFoundError, IsADirectoryError, PermissionError) as exc:
        raise LogError(f"{path}: cannot read the log ({exc.strerror or exc})") from None
    with f:
        return read_runtime_lines(f, str(path))


def read_runtime_text(text: str, name: str = "<log>") -> RuntimeLog:
    return read_runtime_lines(text.splitlines(), name)


def read_runtime_lines(lines, name: str) -> RuntimeLog:
    log = RuntimeLog(path=name)
    clock = _Clock()
    rank_index: dict[str, int] = {}
    number = 0
    for number, text in enumerate(lines, 1):  # noqa: B007 - number is the count after the loop
        _read_line(log, clock, rank_index, text.rstrip("\n"), number)
    log.n_lines = number
    step0 = next((x for x in log.t if not math.isnan(x)), math.nan)  # the first stamped step, at once in a real log
    first = min((x for x in (step0, *(e.t for e in log.events)) if not math.isnan(x)), default=math.nan)
    if not math.isnan(first):  # seconds from the first stamped runtime line (the steps' column: RuntimeTimeline)
        log.t0 = first
        for e in log.events:
            e.t -= first
    return log


def _read_line(log, clock, rank_index, text: str, number: int) -> None:
    anchor = F.ANCHOR.search(text)
    if anchor is None:
        if "max_total_num_token" in text or "KV cache size:" in text:
            _pool_line(log, text, number)
        else:
            log.other_lines += 1
            if len(log.other_examples) < 5 and text.strip():
                log.other_examples.append((number, text.strip()[:160]))
        return
    kind = F.ANCHORS[anchor.group(0)]
    pattern = F.PATTERNS.get(kind)
    m = pattern.search(text, max(0, anchor.start() - 40)) if pattern else None  # KV cache pool is full. ...
    if m:
        prefix = text[:m.start()]
        if kind == "vllm" and m.group("engine"):
            where = (clock.seconds(prefix), f"Engine {int(m.group('engine'))}")
        else:
            where = clock.where(prefix)
        _read_items(log, rank_index, kind, m.group("rest"), where, number)
        return
    if kind == "preempt" and (m := F.VLLM_PREEMPT.search(text)):
        total = int(m.group("total")) if m.group("total") else None
        log.events.append(Event("preempt", number, clock.seconds(text[:m.start()]), "", 1, total=total))
        log.engine = log.engine or "vllm"
        return
    if kind == "vllm_hit" and (m := F.VLLM_HIT_V0.search(text)):
        log.vllm_hit[number] = round(float(m.group("gpu")) / 100.0, 12)
        hits = log.cols["logged_hit_rate"]
        if log.n_steps and log.kind[-1] == _KIND_INDEX["vllm"] and math.isnan(hits[-1]):
            hits[-1] = log.vllm_hit[number]  # V0 prints it on its own line after the stats line it belongs to
        return
    _skip(log, number, "a runtime message kvlab cannot read (garbled or cut before its fields)")


def _pool_line(log, text: str, number: int) -> None:
    m = _POOL_SGLANG.search(text) or _POOL_VLLM.search(text)
    if m and log.pool_tokens is None:
        log.pool_tokens = int(m.group(1).replace(",", ""))
        log.pool_line = number
    else:
        log.other_lines += 1


def _skip(log, number: int, why: str) -> None:
    log.n_skipped += 1
    if len(log.skipped) < MAX_NOTED:
        log.skipped.append((number, why))


def _values(log, kind: str, rest: str, number: int) -> dict | None:
    items, cut = F.split_items(rest)
    values: dict = {}
    fields = F.FIELDS
    for name, raw in items:
        column = fields.get(name)
        if column is None:
            if name not in F.KNOWN_EXTRA:
                _unknown(log, name, number)
            continue
        if column in values:
            continue
        value = float(raw) if len(raw) < 20 and raw.replace(".", "", 1).isdigit() else F.number(column, raw)
        if value is None:
            _skip(log, number, f"{name}: {raw[:40]!r} is not a number")
            return None
        values[column] = value
    for column in F.REQUIRED[kind]:
        if column not in values:
            missing = [c for c in F.REQUIRED[kind] if c not in values]
            _skip(log, number, f"{kind} line without {', '.join(missing)} (garbled or cut)")
            return None
    if cut and len(log.cut_lines) < MAX_NOTED:
        log.cut_lines.append(number)
    return values


def _unknown(log, name: str, number: int) -> None:
    """Count a field kvlab does not know by its name (the first MAX_UNKNOWN names; the rest as one)."""
    name = name[:60]
    if name not in log.unknown_fields and len(log.unknown_fields) >= MAX_UNKNOWN:
        name = "(other names)"
    log.unknown_fields[name] += 1
    log.unknown_first.setdefault(name, number)


def _read_items(log, rank_index, kind, rest, where, number) -> None:
    values = _values(log, kind, rest, number)
    if values is None:
        return
    log.engine = log.engine or ("vllm" if kind == "vllm" else "sglang")
    t, rank = where
    if kind == "retract":
        before, after = values.get("ratio", (None, None))
        log.events.append(Event("retract", number, t, rank, int(values["retracted"]), before, after))
        return
    if values.get("preemptions"):  # vLLM V1's count since its last stats line
        log.events.append(Event("preempt", number, t, rank, int(values["preemptions"])))
    if rank not in rank_index:
        rank_index[rank] = len(log.ranks)
        log.ranks.append(rank)
    log.kind.append(_KIND_INDEX[kind])
    log.line.append(number)
    log.t.append(t)
    log.rank.append(rank_index[rank])
    for column, values_of in log.cols.items():
        values_of.append(values.get(column, math.nan))
