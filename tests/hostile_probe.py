"""The closing re-run of issue 26: bad, hostile and oversized inputs across ``replay``, ``simulate``, ``sweep``,
``explain-log``, ``report`` and ``app``, each run as a real ``python -m kvlab.cli`` process with a time limit, and
every outcome classified:

- ``clear``: exit 2 with a ``kvlab: error:`` (or argparse ``kvlab CMD: error:``) line naming the input;
- ``unnamed``: exit 2, but no error line names the input (its file, or the flag given);
- ``answered``: exit 0 on a randomly mutated input that may still be valid (the mutation fuzz's share);
- ``silent``: exit 0 on an input known to be bad (a silent result);
- ``traceback``: exit 3 (kvlab's internal error), another exit code, or a traceback on stderr;
- ``hang``: still running at the time limit (killed with its process group);
- ``data_lost``: a user file the probe set up (an existing ``--out``, a symlink's target) changed or vanished;
- ``process_left``: a process of the probe's session still alive after it exited (killed, then counted).

The known-bad probes are generated per category from tables of fields and hostile values; the mutated ones
reuse ``tests/cli_fuzz.py``'s corpus and mutations (``cli_fuzz.cases``) and its hostile pickles. Run::

    python3 tests/hostile_probe.py                 # every probe, 4 at a time; prints the tables
    python3 tests/hostile_probe.py --jobs 2 --mutations 50 --only replay,sweep

Each probe is a process of its own, forked from a warm interpreter that imported ``kvlab.cli`` (``--cold``: one
``python -m kvlab.cli`` each); its address space is capped (6 GiB, as the fuzz does), so an unbounded allocation shows as an error
instead of taking the machine down. ``tests/test_hostile_probe.py`` runs a small subset in CI.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pickle
import random
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import cli_fuzz  # noqa: E402 - the fuzz's corpus, mutations and hostile pickles

REPO = cli_fuzz.REPO
SNAPSHOT = REPO / "data" / "snapshots" / "example.pickle"
TRACE = cli_fuzz.TRACE
SGLANG_LOG = REPO / "data" / "examples" / "server_logs" / "llama-3.1-8b-h100-sglang-0.5.23.log"
CONFIG = REPO / "data" / "tiny-llama" / "config.json"
TIMEOUT_S = 60.0  # a probe past this is a hang (a cold start with torch takes up to ~15 s on a loaded machine)
MEMORY = 6 << 30
OUTCOMES = ("clear", "unnamed", "answered", "silent", "traceback", "hang", "data_lost", "process_left")
BAD_OUTCOMES = ("traceback", "hang", "data_lost", "process_left")


@dataclass
class Probe:
    category: str  # special-file, sparse-file, oversized, wrong-type, duplicate, out-of-range, output-path,
    # hostile-pickle, deep-nesting, contradictory, mutated
    what: str
    argv: list[str]
    names: tuple[str, ...]  # any of these in an error line names the input
    bad: bool = True  # known bad: exit 0 is a silent result
    protect: tuple[Path, ...] = ()  # user files that must be left as they were
    stdin_null: bool = True

    @property
    def command(self) -> str:
        return self.argv[0]


@dataclass
class Result:
    probe: Probe
    outcome: str
    code: int | str
    seconds: float
    err: str = ""
    notes: list[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------- the probes

HUGE = ("9" * 400, "1e30", "99999999999999999999", "-1", "0", "nan", "inf", "\U0001f4a5", "", "1.5")


def _w(path: Path, data: bytes | str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    (path.write_bytes if isinstance(data, bytes) else path.write_text)(data)
    return path


def _special(tmp: Path) -> list[tuple[str, Path]]:
    fifo = tmp / "special" / "fifo"
    fifo.parent.mkdir(parents=True, exist_ok=True)
    if not fifo.exists():
        os.mkfifo(fifo)
    folder = tmp / "special" / "folder.pickle"
    folder.mkdir(exist_ok=True)
    return [("a folder", folder), ("a FIFO", fifo), ("/dev/zero", Path("/dev/zero")),
            ("a missing file", tmp / "special" / "missing.txt"), ("an empty file", _w(tmp / "special" / "empty", b"")),
            ("binary junk", _w(tmp / "special" / "junk.bin", bytes(range(256)) * 64))]


def _snapshot_probes(tmp: Path) -> list[Probe]:
    out = [Probe("special-file", f"replay on {what}", ["replay", str(p)], (p.name,)) for what, p in _special(tmp)]
    for name, data in cli_fuzz.hostile_pickles():
        p = _w(tmp / "pickles" / f"{name.replace(' ', '-')}.pickle", data)
        out.append(Probe("hostile-pickle", f"replay on a {name}", ["replay", str(p)], (p.name,)))
    raw = pickle.loads(SNAPSHOT.read_bytes())
    fields = (("segments", 0, None, "device"), ("segments", 0, None, "address"), ("segments", 0, None, "total_size"),
              ("segments", 0, 0, "address"), ("segments", 0, 0, "size"), ("segments", 0, 0, "state"),
              ("device_traces", 0, 0, "action"), ("device_traces", 0, 0, "size"), ("device_traces", 0, 1, "addr"))
    values = (-1, 1.5, "12", None, 10 ** 400, float("nan"), [1], {"a": 1})
    for n, (top, i, j, key) in enumerate(fields):
        for k, value in enumerate(values):
            obj = pickle.loads(pickle.dumps(raw))
            node = obj[top][i] if j is None else (obj[top][i]["blocks"][j] if top == "segments" else obj[top][i][j])
            node[key] = value
            p = _w(tmp / "snapshots" / f"field{n}-{k}.pickle", pickle.dumps(obj, protocol=4))
            where = f"{top}[{i}]" + ("" if j is None else f"[{j}]") + f".{key}"
            out.append(Probe("wrong-type", f"replay: {where} = {value!r:.30}", ["replay", str(p)], (p.name,)))
    for key in ("max_split_size", "roundup_power2_divisions", "garbage_collection_threshold", "expandable_segments"):
        for k, value in enumerate(("20MB", float("inf"), 1.5, "False", -5, [1, "x"])):
            obj = pickle.loads(pickle.dumps(raw))
            obj.setdefault("allocator_settings", {})[key] = value
            p = _w(tmp / "snapshots" / f"settings-{key}-{k}.pickle", pickle.dumps(obj, protocol=4))
            out.append(Probe("wrong-type", f"replay: allocator_settings.{key} = {value!r}", ["replay", str(p)],
                             (p.name,), bad=not (key == "max_split_size" and value == -5)))
    for value in ("expandable_segments=True,expandable_segments=False", "bogus=1", "max_split_size_mb=x",
                  "roundup_power2_divisions=1e30", "expandable_segments", "=",
                  "expandable_segments=\U0001f4a5"):
        category = "duplicate" if value.count("expandable_segments=") == 2 else "out-of-range"
        out.append(Probe(category, f"replay --what-if {value[:40]}", ["replay", str(SNAPSHOT), "--what-if", value],
                         ("--what-if",)))
    for flag in ("--capacity", "--device-memory"):
        for value in ("1e400GiB", "-1", "0", "\U0001f4a5", "9" * 400 + "TiB", "nan GiB"):
            out.append(Probe("out-of-range", f"replay {flag} {value[:20]}", ["replay", str(SNAPSHOT), flag, value],
                             (flag,)))
    out.append(Probe("oversized", "replay --device 10^20", ["replay", str(SNAPSHOT), "--device", "9" * 20],
                     ("--device",)))
    for value in ("", ",,,", "max_split_size_mb=99999999999999999999", "max_split_size_mb=\u00b2"):
        out.append(Probe("out-of-range", f"replay --what-if {value[:40]!r}", ["replay", str(SNAPSHOT), "--what-if",
                                                                              value], ("--what-if",)))
    return out + _deep_snapshots(tmp, raw) + _contradictory_snapshots(tmp, raw) + _sparse_probes(tmp)


def _deep_snapshots(tmp: Path, raw: dict) -> list[Probe]:
    """A value nested 200,000 deep (lists or tuples, built with opcodes: pickle.dumps would recurse) in a field."""
    out = []
    nodes = {"address": lambda s: s["segments"][0], "state": lambda s: s["segments"][0]["blocks"][0],
             "time_us": lambda s: s["device_traces"][0][0]}
    for key, node in nodes.items():
        for kind, nested in (("list", b"(" * 200_000 + b"K\x01" + b"l" * 200_000),
                             ("tuple", b"K\x01" + b"\x85" * 200_000)):
            obj = pickle.loads(pickle.dumps(raw))
            node(obj)[key] = "NESTED-HERE"
            data = pickle.dumps(obj, protocol=2).replace(b"X\x0b\x00\x00\x00NESTED-HERE", nested)
            p = _w(tmp / "snapshots" / f"deep-{key}-{kind}.pickle", data)
            out.append(Probe("deep-nesting", f"replay: {key} = a {kind} nested 200,000 deep", ["replay", str(p)],
                             (p.name,)))
    return out


def _contradictory_snapshots(tmp: Path, raw: dict) -> list[Probe]:
    """Snapshots that contradict themselves (issue 37): each was replayed with exit 0 and no note."""
    def seg(key, value):
        return lambda s: s["segments"][0].__setitem__(key, value)

    def move(trace, frm, to):
        trace.insert(to, trace.pop(frm))

    changes = {
        "a block beyond its segment's end": lambda s: s["segments"][0]["blocks"][-1].__setitem__(
            "size", s["segments"][0]["blocks"][-1]["size"] + 4096),
        "a block outside every segment": lambda s: s["segments"][0]["blocks"][0].__setitem__("address", 0x1000),
        "a free before its alloc": lambda s: [move(s["device_traces"][0], 10, 6) for _ in range(2)],
        "a free twice": lambda s: s["device_traces"][0].insert(11, dict(s["device_traces"][0][10])),
        "segments of another device": lambda s: [g.__setitem__("device", 1) for g in s["segments"]],
        "total_size 0": seg("total_size", 0), "segment_type 7": seg("segment_type", 7),
        "segment_type None": seg("segment_type", None), "is_expandable 'yes'": seg("is_expandable", "yes"),
        "is_expandable 1": seg("is_expandable", 1), "is_expandable 'False'": seg("is_expandable", "False"),
    }
    out = []
    for n, (what, change) in enumerate(changes.items()):
        obj = pickle.loads(pickle.dumps(raw))
        change(obj)
        p = _w(tmp / "snapshots" / f"contradiction{n}.pickle", pickle.dumps(obj, protocol=4))
        out.append(Probe("contradictory", f"replay: {what}", ["replay", str(p)], (p.name,)))
    return out


def _sparse_probes(tmp: Path) -> list[Probe]:
    """A 4 GiB sparse file (no disk used) given to each reader that reads a file whole: MemoryError, exit 3, in
    issue 37; refused by size now, naming the flag, size and limit."""
    path = tmp / "special" / "sparse-4gib"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        f.truncate(4 << 30)
    argvs = (["replay", str(path)], ["simulate", "--trace", str(path)], ["sweep", "--trace", str(path)],
             ["explain-log", str(path)])
    return [Probe("sparse-file", f"{argv[0]} on a 4 GiB sparse file", argv, (path.name,)) for argv in argvs]


def _trace_line(**change) -> str:
    record = {"timestamp": 0, "input_length": 1209, "output_length": 182, "hash_ids": [0, 1, 2]}
    record.update(change)
    return json.dumps(record)


def _trace_probes(tmp: Path) -> list[Probe]:
    out = [Probe("special-file", f"simulate --trace on {what}", ["simulate", "--trace", str(p)], (p.name,))
           for what, p in _special(tmp)]
    rest = TRACE.read_text().splitlines()[1:]
    lines = []
    for key in ("timestamp", "input_length", "output_length"):
        for value in (10 ** 30, 10 ** 400, -1, 1.5, "12", None, [], 10 ** 7 + 1):
            if key == "timestamp" and value == 10 ** 7 + 1:
                continue  # 10^7 ms is 2.8 hours: a timestamp, not a bad one
            lines.append(("oversized" if isinstance(value, int) and value > 10 ** 6 else "wrong-type",
                          f"{key} = {str(value)[:20]}", _trace_line(**{key: value})))
    for value in ([0, 1], [0, 1, 2, 3], [-1, 0, 1], [0, "1", 2], [2 ** 80, 0, 1], "x"):
        lines.append(("wrong-type", f"hash_ids = {value!r:.20}", _trace_line(hash_ids=value)))
    lines += [("wrong-type", "timestamp NaN", _trace_line().replace('"timestamp": 0', '"timestamp": NaN')),
              ("wrong-type", "timestamp Infinity", _trace_line().replace('"timestamp": 0', '"timestamp": Infinity')),
              ("duplicate", "output_length twice", _trace_line()[:-1] + ', "output_length": 5}'),
              ("duplicate", "timestamp twice", '{"timestamp": 5, ' + _trace_line()[1:]),
              ("wrong-type", "deep nesting", "[" * 100_000 + "]" * 100_000),
              ("wrong-type", "not an object", "[1, 2, 3]")]
    for n, (category, what, line) in enumerate(lines):
        p = _w(tmp / "traces" / f"line{n}.jsonl", "\n".join([line, *rest]) + "\n")
        out.append(Probe(category, f"simulate --trace: {what}", ["simulate", "--trace", str(p)], (p.name,)))
    p = _w(tmp / "traces" / "outputs-1e7.jsonl", "".join(_trace_line(timestamp=i, output_length=10 ** 7) + "\n"
                                                          for i in range(2)))
    out.append(Probe("oversized", "simulate: two requests of 10^7 output tokens", ["simulate", "--trace", str(p)],
                     (p.name,), bad=False))
    for flag in ("--kv-tokens", "--kv-pages", "--max-running", "--page-size", "--seed"):
        for value in HUGE:
            out.append(Probe("oversized" if value[:1].isdigit() else "out-of-range", f"simulate {flag} {value[:20]}",
                             ["simulate", "--workload", "few-shot", flag, value], (flag,),
                             bad=not (flag == "--seed" and value.lstrip("-").isdigit())))  # any int is a seed
    out.append(Probe("oversized", "simulate pages × page size beyond memory",
                     ["simulate", "--workload", "few-shot", "--kv-pages", "60000000", "--page-size", "100000"],
                     ("--kv-pages", "--page-size")))
    for value in ("num_groups=1e9", "num_groups=" + "9" * 400, "num_groups=4", "num_groups=nan", "bogus=1", "=",
                  "num_groups=-1"):
        params = ["--workload-param", value] + (["--workload-param", "num_groups=8"] if value == "num_groups=4" else [])
        out.append(Probe("duplicate" if value == "num_groups=4" else "out-of-range", f"simulate --workload-param "
                         f"{value[:30]}", ["simulate", "--workload", "generated-shared-prefix", *params],
                         ("--workload-param", value.split("=")[0] or "--workload-param")))
    return out + _huge_workload_probes(tmp)


# issue 37: each was a MemoryError (exit 3) or ran past 60 s; each must now be refused in seconds, naming a parameter
HUGE_WORKLOADS = (
    ("generated-shared-prefix", "num_groups=1000000", "vocab_size=1000000"),
    ("generated-shared-prefix", "num_groups=1000", "prompts_per_group=1000"),
    ("generated-shared-prefix", "prompts_per_group=1000000"),
    ("generated-shared-prefix", "output_len=1000000"),
    ("multi-turn-chat", "turns=1000000"),
    ("multi-turn-chat", "turns=20000", "num_sessions=1", "user_len=1", "output_len=0"),
    ("few-shot", "num_requests=1000000"),
    ("few-shot", "num_examples=1000000", "example_len=1", "num_requests=1000"),
    ("multiturn", "num_clients=1000000"),  # issue 34's bench_multiturn workload
    ("multiturn", "num_rounds=1000", "request_length=100000"),
)


def _huge_workload_probes(tmp: Path) -> list[Probe]:
    """Generated workloads and a trace beyond the simulator's bounds (kvlab.workloads.bounds), the seed given as a
    workload parameter, and page sizes and pools the user's flag must be named for."""
    out = []
    for command in ("simulate", "sweep"):
        for name, *params in HUGE_WORKLOADS:
            argv = [command, "--workload", name, *(x for p in params for x in ("--workload-param", p))]
            out.append(Probe("oversized", f"{command} {name} {' '.join(params)}", argv,
                             tuple(p.split("=")[0] for p in params)))
        out.append(Probe("duplicate", f"{command} --workload-param seed=5",
                         [command, "--workload", "few-shot", "--workload-param", "seed=5"], ("--workload-param", "--seed")))
        for flags in (["--page-size", "10000"], ["--page-size", "67108864"], ["--page-size", "512", "--kv-pages",
                                                                              "20000000000"]):
            out.append(Probe("out-of-range", f"{command} {' '.join(flags)}", [command, "--workload", "few-shot", *flags],
                             (" ".join(flags[-2:]),)))
    p = _w(tmp / "traces" / "outputs-4e7.jsonl", "".join(_trace_line(timestamp=i, output_length=10 ** 7) + "\n"
                                                          for i in range(4)))
    out.append(Probe("oversized", "simulate: four requests of 10^7 output tokens", ["simulate", "--trace", str(p)],
                     (p.name,)))
    return out


def _sweep_probes(tmp: Path) -> list[Probe]:
    base = ["sweep", "--trace", str(TRACE), "--eviction", "shortfall", "--workers", "1"]
    out = []
    for value in ("", ",,", "30,,40", "0", "-5", "9" * 30, "nan", "\U0001f4a5", "30,30"):
        out.append(Probe("out-of-range", f"sweep --kv-pages {value!r}", [*base, "--kv-pages", value], ("--kv-pages",),
                         bad=value != "30,30"))
    for flag in ("--max-running", "--page-size", "--policy", "--eviction", "--workers"):
        for value in ("", "0", "9" * 30, "x"):
            out.append(Probe("out-of-range", f"sweep {flag} {value!r}", [*base, "--kv-pages", "30", flag, value],
                             (flag,)))
    folder = tmp / "outputs"
    folder.mkdir(parents=True, exist_ok=True)
    user = _w(folder / "user.csv", "name,score\nada,1\n")
    link_target = _w(folder / "precious.txt", "do not touch\n")
    link = folder / "link.csv"
    if not link.exists():
        link.symlink_to(link_target)
    readonly = folder / "readonly"
    readonly.mkdir(exist_ok=True)
    readonly.chmod(0o500)
    notes = _w(folder / "notes.parquet", b"PAR1 not really")
    outs = [("an existing user CSV", user, (user,)), ("a symlink to a user file", link, (link_target,)),
            ("a path under a file (user.csv/x.csv)", user / "x.csv", (user,)),
            ("a file in a read-only folder", readonly / "x.csv", ()), ("a folder", folder, (user,)),
            ("a user file with a parquet name", notes, (notes,)), ("a FIFO", tmp / "special" / "fifo", ())]
    outs += _linked_outs(folder)
    root = os.geteuid() == 0  # root writes into a read-only folder: then that probe is no bad input
    for what, path, protect in outs:
        out.append(Probe("output-path", f"sweep --out {what}", [*base, "--kv-pages", "30", "--out", str(path)],
                         (path.name, "--out"), protect=protect, bad=not (root and "read-only" in what)))
    for what, p in _special(tmp)[:3]:
        out.append(Probe("special-file", f"sweep --trace on {what}", ["sweep", "--trace", str(p), "--kv-pages", "30"],
                         (p.name,)))
    return out


def _linked_outs(folder: Path) -> list[tuple[str, Path, tuple[Path, ...]]]:
    """``--out`` paths that are links (issue 37): a symlink to a sweep's own CSV (a file the sweep would add to), a
    dangling symlink, a symlink to a folder, a hard link to a sweep CSV. Each must leave the link and its target as
    they were (a dangling link's target must not appear)."""
    from kvlab.sweep.store import COLUMNS

    sweep_csv = _w(folder / "sweep-rows.csv", ",".join(COLUMNS) + "\n")
    shared = _w(folder / "shared-rows.csv", ",".join(COLUMNS) + "\n")
    links = {"to-sweep-csv.csv": sweep_csv, "dangling.csv": folder / "elsewhere" / "made.csv",
             "to-folder.csv": folder / "readonly"}
    for name, target in links.items():
        if not (folder / name).is_symlink():
            (folder / name).symlink_to(target)
    hard = folder / "hard-link.csv"
    if not hard.exists():
        os.link(shared, hard)
    return [("a symlink to a sweep CSV", folder / "to-sweep-csv.csv", (folder / "to-sweep-csv.csv", sweep_csv)),
            ("a dangling symlink", folder / "dangling.csv", (folder / "dangling.csv", links["dangling.csv"])),
            ("a symlink to a folder", folder / "to-folder.csv", (folder / "to-folder.csv",)),
            ("a hard link to a sweep CSV", hard, (hard, shared))]


def _log_probes(tmp: Path) -> list[Probe]:
    out = [Probe("special-file", f"explain-log on {what}", ["explain-log", str(p)], (p.name,))
           for what, p in _special(tmp)]
    text = SGLANG_LOG.read_text()
    settings = {"mem_fraction_static": "0.835", "tp_size": "1", "dp_size": "1", "page_size": "1"}
    for n, (key, old) in enumerate(settings.items()):
        for k, value in enumerate(("0", "-2", "1.5", "inf", "nan", "1" + "0" * 30, "x", "\U0001f4a5")):
            if key == "mem_fraction_static" and value == "x":
                continue
            p = _w(tmp / "logs" / f"setting{n}-{k}.log", text.replace(f"{key}={old}", f"{key}={value}"))
            out.append(Probe("out-of-range", f"explain-log: {key}={value[:20]}", ["explain-log", str(p)], (p.name,),
                             ))
    readings = ("avail mem=78.69 GB", "avail mem=63.65 GB", "#tokens: 415056", "max_total_num_tokens=415056")
    for n, old in enumerate(readings):
        number = old.split("=")[-1].split(": ")[-1].split(" ")[0]
        for k, value in enumerate(("9" * 400, "0", "0.00", "1e30")):
            p = _w(tmp / "logs" / f"reading{n}-{k}.log", text.replace(old, old.replace(number, value)))
            out.append(Probe("oversized" if len(value) > 3 else "out-of-range", f"explain-log: {old[:20]} -> "
                             f"{value[:12]}", ["explain-log", str(p)], (p.name,), bad=value not in ("0", "0.00")))  # a zero is shown
    lines = text.splitlines()
    restarted = _w(tmp / "logs" / "restarted.log", "\n".join(lines[:4] + lines) + "\n")
    out.append(Probe("duplicate", "explain-log: a restarted server (two starts)", ["explain-log", str(restarted)],
                     (restarted.name,), bad=False))
    hf = REPO / "data" / "examples" / "models" / "qwen3-235b-a22b-fp8" / "config.json"
    config = json.loads(hf.read_text())
    qwen_log = REPO / "data" / "examples" / "server_logs" / "qwen3-235b-fp8-4xh100-sglang-0.4.9.log"
    keys = ("num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_size",
            "max_position_embeddings", "num_experts", "moe_intermediate_size")
    for n, key in enumerate(keys):
        for k, value in enumerate((10 ** 30, 1e30, 0, -1, 1.5, "12", None, [1])):
            p = _w(tmp / "configs" / f"c{n}-{k}" / "config.json", json.dumps({**config, key: value}))
            out.append(Probe("oversized" if value in (10 ** 30, 1e30) else "wrong-type",
                             f"explain-log --model-config: {key} = {value!r}",
                             ["explain-log", str(qwen_log), "--model-config", str(p)], ("config.json", p.parent.name),
                             # an absent (null) field is allowed where the KV cell needs none; 0 experts is dense
                             bad=value is not None and not (value == 0 and ("moe" in key or key == "num_experts"))))
    deep = _w(tmp / "configs" / "deep.json", '{"a":' * 50_000 + "1" + "}" * 50_000)
    out.append(Probe("wrong-type", "explain-log --model-config: nested 50,000 deep",
                     ["explain-log", str(SGLANG_LOG), "--model-config", str(deep)], (deep.name,)))
    out += _log_probes_issue37(tmp, config, qwen_log)
    for value in ("tp=1e20", "tp=" + "9" * 30, "tp=0", "mem_fraction_static=2", "mem_fraction_static=nan", "bogus=1",
                  "gpu=\U0001f4a5", "kv_cache_dtype=int3", "tp"):
        out.append(Probe("out-of-range", f"explain-log --what-if {value[:20]}",
                         ["explain-log", str(SGLANG_LOG), "--model-config", "llama-3.1-8b", "--what-if", value],
                         ("--what-if",)))
    for flag, value in (("--mem-fraction-static", "1.5"), ("--mem-fraction-static", "nan"), ("--gpu", "\U0001f4a5"),
                        ("--sglang-version", "99.x"), ("--kv-cache-dtype", "int3"), ("--model-config", "no-such")):
        out.append(Probe("out-of-range", f"explain-log {flag} {value}", ["explain-log", str(SGLANG_LOG), flag, value],
                         (flag, value)))
    return out


def _log_probes_issue37(tmp: Path, config: dict, qwen_log: Path) -> list[Probe]:
    """Issue 37's explain-log categories: a config value nested past what any config nests (json reads it, later
    walks would not), counts beyond any model (each was a per-layer loop that never ended), an SGLang version kvlab
    does not know, a key given twice on one log line, and vLLM reading lines whose number cannot be read."""
    out = []
    for n, (key, value) in enumerate((("quantization_config", "[" * 40 + "]" * 40), ("rope_scaling", "[" * 900 + "]" * 900),
                                      ("vocab_size", "9" * 5000))):
        text = json.dumps(config)[:-1] + f', "{key}": {value}}}'
        p = _w(tmp / "configs" / f"deep37-{n}" / "config.json", text)
        out.append(Probe("wrong-type", f"explain-log --model-config: {key} = {value[:12]}...",
                         ["explain-log", str(qwen_log), "--model-config", str(p)], (key,)))
    for n, (key, value) in enumerate((("num_hidden_layers", 10 ** 12), ("num_hidden_layers", 10 ** 9),
                                      ("num_experts", 10 ** 9), ("hidden_size", 10 ** 11), ("vocab_size", 10 ** 11),
                                      ("head_dim", 10 ** 9), ("intermediate_size", 10 ** 11))):
        p = _w(tmp / "configs" / f"huge37-{n}" / "config.json", json.dumps({**config, key: value}))
        out.append(Probe("oversized", f"explain-log --model-config: {key} = {value:.0e}",
                         ["explain-log", str(qwen_log), "--model-config", str(p), "--what-if", "tp=8"], (key,)))
    for version in ("0.0.0", "0.1.14", "0.1.16"):  # (a newer release than kvlab read is explained, with a warning)
        out.append(Probe("out-of-range", f"explain-log --sglang-version {version}",
                         ["explain-log", str(SGLANG_LOG), "--sglang-version", version], ("--sglang-version", version)))
    text = SGLANG_LOG.read_text()
    for n, (old, new) in enumerate((("tp_size=1,", "tp_size=1, tp_size=2,"),
                                    ("context_len=131072", "context_len=131072, context_len=5"))):
        p = _w(tmp / "logs" / f"twice37-{n}.log", text.replace(old, new))
        out.append(Probe("duplicate", f"explain-log: {new[:40]} on one line", ["explain-log", str(p)], (p.name,)))
    vllm = REPO / "data" / "examples" / "server_logs" / "llama-3.1-70b-4xh100-vllm-0.34.0.log"
    for n, (old, new) in enumerate((("Model loading took 32.86", "Model loading took -1"),
                                    ("Available KV cache memory: 39.6", "Available KV cache memory: nan"),
                                    ("context_len=131072", "context_len=" + "9" * 400))):
        p = _w(tmp / "logs" / f"unread37-{n}.log", (vllm if "context" not in old else SGLANG_LOG).read_text()
               .replace(old, new, 1))
        out.append(Probe("oversized" if "9" * 9 in new else "wrong-type", f"explain-log: {new[:40]}",
                         ["explain-log", str(p), "--model-config", "llama-3.1-70b" if "context" not in old
                          else "llama-3.1-8b"], (p.name,)))
    return out


def _report_app_probes(tmp: Path) -> list[Probe]:
    nbdir = tmp / "nbs"
    _w(nbdir / "01_nocells.ipynb", json.dumps({"nbformat": 4, "metadata": {}}))
    fake = _w(tmp / "nbs-file", "not a folder")
    out_dir = tmp / "report-out"
    user = _w(out_dir / "mine.txt", "a user's file\n")
    readonly = tmp / "readonly-report"
    readonly.mkdir(exist_ok=True)
    readonly.chmod(0o500)
    out = []
    for argv, names, category in (
            (["--notebooks", ""], ("--notebooks",), "out-of-range"),
            (["--notebooks", ",,"], ("--notebooks",), "out-of-range"),
            (["--notebooks", "99"], ("--notebooks", "99"), "out-of-range"),
            (["--device", "\U0001f4a5"], ("--device",), "out-of-range"),
            (["--device", "cuda:x"], ("--device",), "out-of-range"),
            (["--notebook-dir", str(fake)], ("--notebook-dir",), "special-file"),
            (["--notebook-dir", str(tmp / "special" / "fifo")], ("--notebook-dir",), "special-file"),
            (["--notebook-dir", str(nbdir), "--no-png", "--out", str(out_dir)], ("--out", out_dir.name), "output-path"),
            *([] if os.geteuid() == 0 else [(["--notebook-dir", str(nbdir), "--no-png", "--out", str(readonly / "r")],
                                             ("readonly-report", "--out"), "output-path")]),
            (["--notebook-dir", str(nbdir), "--no-png", "--out", str(user)], ("mine.txt", "--out"), "output-path")):
        out.append(Probe(category, f"report {' '.join(a[-30:] for a in argv)}", ["report", *argv], names,
                         protect=(user,)))
    out.append(Probe("wrong-type", "report on a notebook JSON without cells",
                     ["report", "--notebook-dir", str(nbdir), "--no-png", "--force", "--out", str(tmp / "rep-nocells")],
                     ("01_nocells",)))
    out += _report_manifest_probes(tmp) + _notebook_file_probes(tmp)
    for argv, names in ((["--port", "70000"], ("--port",)), (["--port", "0"], ("--port",)),
                        (["--port", "-1"], ("--port",)), (["--port", "x"], ("--port",)),
                        (["--device", "\U0001f4a5"], ("--device",)), (["99"], ("99",)),
                        (["--notebook-dir", str(fake)], ("--notebook-dir",)),
                        (["--max-kernels", "-1"], ("--max-kernels",)),
                        (["--cull-idle-seconds", "1e30"], ("--cull-idle-seconds",)),
                        (["--notebook-dir", str(tmp / "special" / "fifo")], ("--notebook-dir",))):
        out.append(Probe("out-of-range" if "--notebook-dir" not in argv else "special-file",
                         f"app {' '.join(argv)[:40]}", ["app", *argv, "--no-browser"], names))
    return out


def _report_manifest_probes(tmp: Path) -> list[Probe]:
    """Report folders whose manifest (``.kvlab-report``) names a file outside the folder (``../``, absolute) or
    inside a report folder that is a link: the report must delete nothing there (issue 37)."""
    nbdir = _w(tmp / "nbs-ok" / "01_tiny.ipynb", json.dumps({"cells": [], "metadata": {}, "nbformat": 4,
                                                              "nbformat_minor": 5})).parent
    out = []
    for what, name in (("a ../ entry", "beside"), ("an absolute entry", "absolute"),
                       ("a linked notebooks/ folder", "linked")):
        case = tmp / "manifests" / name
        precious = _w(case / "victim" / "precious.txt", "a user's file\n")
        site = case / "site"
        entry = {"a ../ entry": "../victim/precious.txt", "an absolute entry": str(precious)}.get(
            what, "notebooks/precious.txt")
        _w(site / ".kvlab-report", json.dumps({"kvlab_report_manifest": 1, "files": {
            entry: hashlib.sha256(precious.read_bytes()).hexdigest()}}))
        if "linked" in what and not (site / "notebooks").is_symlink():
            (site / "notebooks").symlink_to(precious.parent)
        out.append(Probe("output-path", f"report --out a folder whose manifest has {what}",
                         ["report", "--notebook-dir", str(nbdir), "--no-png", "--out", str(site)],
                         (".kvlab-report", "notebooks"), protect=(precious,)))
    return out


def _notebook_file_probes(tmp: Path) -> list[Probe]:
    """Notebooks ``report`` and ``app`` cannot read: a FIFO (it hung both), /dev/zero, JSON nested 50,000 deep
    (exit 3), no ``cells`` under a name with a terminal escape (exit 3 in app; the name must be shown escaped)."""
    def folder(name: str, make) -> Path:
        path = tmp / "notebook-files" / name.split("_", 1)[1].split(".")[0] / name
        if not path.exists() and not path.is_symlink():
            path.parent.mkdir(parents=True, exist_ok=True)
            make(path)
        return path

    fifo = folder("01_fifo.ipynb", os.mkfifo)
    deep = folder("01_deep.ipynb", lambda p: p.write_text('{"cells": [], "metadata": ' + '{"a": ' * 50_000 + "1"
                                                          + "}" * 50_000 + ', "nbformat": 4}'))
    zero = folder("01_zero.ipynb", lambda p: p.symlink_to("/dev/zero"))
    escaped = folder("01_\x1b[2Jnocells.ipynb", lambda p: p.write_text(json.dumps({"nbformat": 4, "metadata": {}})))
    shown = "01_\\x1b[2Jnocells"  # as kvlab.safe_text.printable writes it: the raw escape names nothing
    out = []
    for command, cases in (("report", ((fifo, "a FIFO"), (deep, "JSON nested 50,000 deep"), (zero, "/dev/zero"))),
                           ("app", ((fifo, "a FIFO"), (escaped, "no cells, an escape in its name"),
                                    (deep, "JSON nested 50,000 deep")))):
        for path, what in cases:
            argv = ["report", "--no-png", "--out", str(tmp / f"rep-{path.stem}")] if command == "report" else \
                ["app", "01", "--no-browser"]
            out.append(Probe("notebook-file", f"{command} on a notebook that is {what}",
                             [*argv, "--notebook-dir", str(path.parent)],
                             (shown,) if path == escaped else (path.name,),
                             protect=(path,) if path in (deep, escaped) else ()))
    return out


def _mutated(tmp: Path, count: int, seed: int) -> list[Probe]:
    """``count`` cases of the mutation fuzz (cli_fuzz.cases): its corpus and mutations, run here as processes."""
    out = []
    for case in cli_fuzz.cases(random.Random(seed), count, tmp / "mutated"):
        protect = () if case.is_output else (case.path,)
        out.append(Probe("mutated", f"{case.kind}: {case.mutation[:80]}", case.argv,
                         (case.path.name, f"'{case.path.stem}-"), bad=False, protect=protect))
    return out


def probes(tmp: Path, *, mutations: int = 60, seed: int = 0) -> list[Probe]:
    (tmp / "mutated").mkdir(parents=True, exist_ok=True)
    return [*_snapshot_probes(tmp), *_trace_probes(tmp), *_sweep_probes(tmp), *_log_probes(tmp),
            *_report_app_probes(tmp), *_mutated(tmp, mutations, seed)]


# ------------------------------------------------------------------------------------------- running one

def _digest(path: Path) -> str:
    try:
        return "link:" + os.readlink(path) if path.is_symlink() else hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY))


def _session_members(sid: int) -> list[int]:
    """Processes of session ``sid`` still alive (the probe's session leader has already exited)."""
    found = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            fields = stat[stat.rindex(")") + 2:].split()
            if fields[0] != "Z" and int(fields[3]) == sid:  # state, ppid, pgrp, session
                found.append(int(entry))
    return found


def _names_input(err: str, names: tuple[str, ...]) -> bool:
    lines = [line for line in err.splitlines() if ": error: " in line and line.startswith("kvlab")]
    return any(name and name in line for line in lines for name in names)


# A warm process that has imported kvlab.cli (and torch, ~3 s) forks one child per probe: the child is a process of
# its own (its own session, memory cap and stderr) that runs the real ``kvlab.cli.main`` and exits with its code,
# so a probe costs a fork, not an interpreter start. ``--cold`` runs ``python -m kvlab.cli`` per probe instead.
ZYGOTE = r"""
import json, os, resource, signal, sys, time
from kvlab.cli import build_parser, main
build_parser()  # what every command imports, imported once here
import kvlab.device.replay.whatif, kvlab.serving, kvlab.sweep.command, kvlab.experiments.shortfall_eviction  # noqa
import kvlab.report, kvlab.app, kvlab.model.hf_config  # noqa
limit = int(sys.argv[1])
reply = os.fdopen(os.dup(1), "w")
for line in sys.stdin:
    request = json.loads(line)
    pid = os.fork()
    if pid == 0:
        os.setsid()
        resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        null = os.open(os.devnull, os.O_RDWR)
        os.dup2(null, 0)
        os.dup2(null, 1)
        os.dup2(os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), 2)
        sys.argv = ["kvlab", *request["argv"]]
        code = 4
        try:
            code = main(request["argv"])
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else 2
        except BaseException:
            import traceback
            traceback.print_exc()
        finally:
            sys.stderr.flush()
            os._exit(code if isinstance(code, int) else 4)
    deadline, status = time.monotonic() + request["timeout"], None
    while status is None:
        done, raw = os.waitpid(pid, os.WNOHANG)
        if done:
            status = os.waitstatus_to_exitcode(raw)
        elif time.monotonic() > deadline:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            status = "hang"
        else:
            time.sleep(0.02)
    reply.write(json.dumps({"pid": pid, "code": status}) + "\n")
    reply.flush()
"""


class Zygote:
    def __init__(self):
        self.proc = None

    def run(self, argv: list[str], stderr: Path, timeout: float) -> tuple[int | str, int]:
        if self.proc is None or self.proc.poll() is not None:
            self.proc = subprocess.Popen([sys.executable, "-c", ZYGOTE, str(MEMORY)], cwd=REPO, text=True,
                                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=_env())
        self.proc.stdin.write(json.dumps({"argv": argv, "stderr": str(stderr), "timeout": timeout}) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            self.stop()
            return "zygote died", 0
        reply = json.loads(line)
        return reply["code"], reply["pid"]

    def stop(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def _env() -> dict:
    return {**os.environ, "PYTHONPATH": str(REPO), "KVLAB_PROGRESS": "0",
            "KVLAB_CRASH_DIR": os.environ.get("KVLAB_PROBE_CRASH_DIR", tempfile.gettempdir())}


def _cold(argv: list[str], timeout: float) -> tuple[int | str, int, str]:
    proc = subprocess.Popen([sys.executable, "-m", "kvlab.cli", *argv], cwd=REPO, env=_env(), text=True,
                            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True, preexec_fn=_limit, errors="replace")
    try:
        _, err = proc.communicate(timeout=timeout)
        return proc.returncode, proc.pid, err
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        _, err = proc.communicate()
        return "hang", proc.pid, err


def run_one(probe: Probe, timeout: float = TIMEOUT_S, zygote: Zygote | None = None) -> Result:
    before = {p: _digest(p) for p in probe.protect}
    start = time.perf_counter()
    if zygote is None:
        code, pid, err = _cold(probe.argv, timeout)
    else:
        fd, name = tempfile.mkstemp(prefix="kvlab-probe-err-")
        os.close(fd)
        code, pid = zygote.run(probe.argv, Path(name), timeout)
        err = Path(name).read_text(errors="replace")
        os.unlink(name)
    seconds = time.perf_counter() - start
    time.sleep(0.2)
    left = _session_members(pid) if pid else []
    for member in left:  # ours: the probe's own session
        try:
            os.kill(member, signal.SIGKILL)
        except ProcessLookupError:
            pass
    changed = [str(p) for p, digest in before.items() if _digest(p) != digest]
    if changed:
        outcome = "data_lost"
    elif left:
        outcome = "process_left"
    elif code == "hang":
        outcome = "hang"
    elif code not in (0, 2) or "Traceback (most recent call last)" in err:
        outcome = "traceback"
    elif code == 0:
        outcome = "silent" if probe.bad else "answered"
    else:
        outcome = "clear" if _names_input(err, probe.names) else "unnamed"
    notes = [f"changed: {c}" for c in changed] + [f"left: pid {member}" for member in left]
    return Result(probe, outcome, code, seconds, err, notes)


def run(all_probes: list[Probe], jobs: int = 4, timeout: float = TIMEOUT_S, *, cold: bool = False,
        on_result=None) -> list[Result]:
    """Every probe, ``jobs`` at a time, in order; warm (forked from a process that imported kvlab.cli) unless
    ``cold``."""
    import queue
    import threading

    todo: queue.Queue = queue.Queue()
    for i, probe in enumerate(all_probes):
        todo.put((i, probe))
    results: list[Result | None] = [None] * len(all_probes)

    def worker() -> None:
        zygote = None if cold else Zygote()
        try:
            while True:
                try:
                    i, probe = todo.get_nowait()
                except queue.Empty:
                    return
                results[i] = run_one(probe, timeout, zygote)
                if on_result is not None:
                    on_result(results[i])
        finally:
            if zygote is not None:
                zygote.stop()

    threads = [threading.Thread(target=worker) for _ in range(max(1, jobs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [r for r in results if r is not None]


# ------------------------------------------------------------------------------------------- the tables

def table(results: list[Result], key) -> str:
    rows = Counter((key(r), r.outcome) for r in results)
    groups = sorted({key(r) for r in results})
    width = max(len("total"), *map(len, groups))
    head = f"{'':<{width}}  " + "  ".join(f"{o:>12}" for o in OUTCOMES) + f"  {'all':>5}"
    lines = [head]
    for group in [*groups, "total"]:
        counts = [sum(rows[(g, o)] for g in groups) if group == "total" else rows[(group, o)] for o in OUTCOMES]
        lines.append(f"{group:<{width}}  " + "  ".join(f"{c:>12}" for c in counts) + f"  {sum(counts):>5}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--jobs", type=int, default=4, help="probes at once (default: %(default)s)")
    parser.add_argument("--mutations", type=int, default=60, help="mutation-fuzz cases (default: %(default)s)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--only", default=None, help="comma-separated commands to probe (default: all)")
    parser.add_argument("--timeout", type=float, default=TIMEOUT_S, help="seconds before a probe is a hang")
    parser.add_argument("--keep", action="store_true", help="keep the probes' files (printed)")
    parser.add_argument("--cold", action="store_true", help="start `python -m kvlab.cli` for every probe (slower)")
    args = parser.parse_args(argv)
    tmp = Path(tempfile.mkdtemp(prefix="kvlab-probe-"))
    crash = tmp / "crashes"
    crash.mkdir()
    os.environ["KVLAB_PROBE_CRASH_DIR"] = str(crash)
    try:
        chosen = probes(tmp, mutations=args.mutations, seed=args.seed)
        if args.only:
            chosen = [p for p in chosen if p.command in args.only.split(",")]
        how = "each a `python -m kvlab.cli` process" if args.cold else "each a process forked from a warm kvlab.cli"
        print(f"{len(chosen)} probes, {how}, {args.jobs} at a time, {args.timeout:.0f} s each at most", flush=True)
        start = time.perf_counter()
        results = run(chosen, args.jobs, args.timeout, cold=args.cold)
        print(f"\nby category ({time.perf_counter() - start:.0f} s):\n{table(results, lambda r: r.probe.category)}")
        print(f"\nby command:\n{table(results, lambda r: r.probe.command)}")
        worst = [r for r in results if r.outcome != "clear" and not (r.outcome == "answered" and
                                                                    r.probe.category == "mutated")]
        if worst:
            print("\nnot clear (and the answers on generated, not mutated, inputs):")
        for r in sorted(worst, key=lambda r: OUTCOMES.index(r.outcome), reverse=True):
            last = (r.err.strip().splitlines() or [""])[-1][:220]
            print(f"  {r.outcome:<12} {r.probe.command:<11} {r.probe.what[:70]:<70} exit {r.code}: {last}"
                  + (f" [{'; '.join(r.notes)}]" if r.notes else ""))
        slow = max(results, key=lambda r: r.seconds)
        print(f"\nslowest: {slow.seconds:.1f} s ({slow.probe.command}: {slow.probe.what})")
        return 1 if any(r.outcome in BAD_OUTCOMES for r in results) else 0
    finally:
        for folder in tmp.rglob("*"):
            if folder.is_dir() and not folder.is_symlink():
                folder.chmod(0o700)
        if args.keep:
            print(f"files kept in {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
