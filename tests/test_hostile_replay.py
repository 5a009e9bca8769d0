"""Issue 37, items 3 to 6 and 8 for `kvlab replay` and the inputs read whole: oversized (sparse) files for every
reader, a MemoryError while reading, a pickle that builds too many objects, deeply nested snapshot values,
snapshots that contradict themselves, and --what-if values that ask for nothing. Each is one ``kvlab: error:``
line naming the input and the field or flag (exit 2), never exit 3 or a silent result."""

from __future__ import annotations

import copy
import os
import pickle
import resource
import struct
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kvlab.input_limits import EXPANSION, available_memory, check_size

REPO = Path(__file__).resolve().parent.parent
SNAPSHOT = REPO / "data" / "snapshots" / "example.pickle"
LOG = REPO / "data" / "examples" / "server_logs" / "llama-3.1-8b-h100-sglang-0.5.23.log"
RAW = pickle.loads(SNAPSHOT.read_bytes())
ADDRESS_SPACE = 6 << 30  # as tests/hostile_probe.py: a reader that ignores its limit fails fast, not the machine


def _cli(argv: list[str], *, address_space: int = ADDRESS_SPACE, timeout: float = 120) -> subprocess.CompletedProcess:
    """``python -m kvlab.cli ARGV`` in a process whose address space is capped."""
    def cap():
        resource.setrlimit(resource.RLIMIT_AS, (address_space, address_space))

    return subprocess.run([sys.executable, "-m", "kvlab.cli", *argv], capture_output=True, text=True, cwd=REPO,
                          preexec_fn=cap, timeout=timeout, env={**os.environ, "PYTHONPATH": str(REPO)})


def _refused(run: subprocess.CompletedProcess, *needles: str) -> str:
    assert run.returncode == 2, (run.returncode, run.stderr[-2000:])
    err = run.stderr
    assert err.startswith("kvlab: error: ") and err.count("\n") == 1 and "Traceback" not in err, err
    for needle in needles:
        assert needle in err, (needle, err)
    return err


def _main(capsys, argv: list[str]) -> subprocess.CompletedProcess:
    """``kvlab ARGV`` in this process, as a finished run (for :func:`_refused`)."""
    from kvlab.cli import main

    code = main(argv)
    captured = capsys.readouterr()
    return subprocess.CompletedProcess(argv, code, captured.out, captured.err)


def _sparse(path: Path, size: int) -> Path:
    with open(path, "wb") as f:
        f.truncate(size)
    return path


# ---- item 3: sizes --------------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, shown, what", [
    (["replay", "{}"], "{}", "memory snapshot"),
    (["simulate", "--trace", "{}"], "--trace {}", "Mooncake-format trace"),
    (["sweep", "--trace", "{}"], "--trace {}", "Mooncake-format trace"),
    (["explain-log", "{}"], "{}", "server log"),
], ids=["replay", "simulate", "sweep", "explain-log"])
def test_a_4_gib_sparse_file_is_refused_before_it_is_read(argv, shown, what, tmp_path):
    """MemoryError, exit 3 (issue 37): refused naming the flag, the size and the limit, before reading a byte."""
    path = _sparse(tmp_path / "big.input", 4 << 30)
    err = _refused(_cli([a.format(path) for a in argv], timeout=60),
                   f"{shown.format(path)}: 4.00 GiB (4,294,967,296 bytes), more than the ",
                   f"reading a {what} takes about ")
    assert "kvlab reads on this machine now" in err and "is available" in err


def test_the_limit_follows_the_memory_the_process_may_use(tmp_path):
    """A fixed 8 GiB cap refused a 9 GB snapshot whatever the machine: the limit is the memory available over the
    reader's expansion factor, so it grows with the address space a process is given."""
    code = "from kvlab.input_limits import size_limit; print(size_limit('snapshot'))"
    limits = []
    for cap in (1 << 30, 2 << 30):  # a bare interpreter maps about 30 MB: the cap leaves the rest
        out = subprocess.run([sys.executable, "-c", f"import resource; resource.setrlimit(resource.RLIMIT_AS, "
                                                    f"({cap}, {cap})); {code}"],
                             capture_output=True, text=True, check=True, cwd=REPO).stdout
        limits.append(int(out))
    step = (1 << 30) // EXPANSION["snapshot"]  # 1 GiB more to map: 64 MiB more of snapshot
    assert limits[1] - limits[0] == pytest.approx(step, abs=8 << 20), limits
    available = available_memory()
    with open("/proc/meminfo") as f:  # never more than the machine says it has free
        meminfo = next(int(line.split()[1]) * 1024 for line in f if line.startswith("MemAvailable:"))
    assert available is not None and available <= meminfo * 1.5
    fits = _sparse(tmp_path / "fits.pickle", available // EXPANSION["snapshot"] // 2)
    check_size(fits, "fits.pickle", "snapshot")  # half the limit: taken
    too_big = _sparse(tmp_path / "big.pickle", available // EXPANSION["snapshot"] * 2)
    with pytest.raises(ValueError, match="big.pickle: .* more than the .* kvlab reads on this machine now"):
        check_size(too_big, "big.pickle", "snapshot")


def test_running_out_of_memory_while_reading_names_the_input(tmp_path):
    """A log of blank lines expands ten times its size (more than a log's factor of 4, so the size check lets it
    through): the MemoryError while reading it is exit 2 naming the file, not an internal error."""
    script = textwrap.dedent(f"""
        import resource, sys
        from kvlab.input_limits import available_memory
        from kvlab.cli import main
        main(['explain-log', {str(LOG)!r}])  # every module explain-log uses, imported before the cap
        soft = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize() + (600 << 20)
        resource.setrlimit(resource.RLIMIT_AS, (soft, soft))
        path = {str(tmp_path / 'blank.log')!r}
        with open(path, 'wb') as f:
            f.write(b'\\n' * (available_memory() // 6))
        sys.exit(main(['explain-log', path]))
    """)
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=REPO, timeout=120)
    _refused(run, f"{tmp_path / 'blank.log'}: ran out of memory while reading this file of ")


# ---- item 4: objects a pickle builds --------------------------------------------------------------------------

def test_a_pickle_of_millions_of_small_dicts_is_stopped_while_it_loads(tmp_path, capsys):
    """40 M small dicts took 3.7 GB and 17 s before their error: loading stops at the bound its size allows."""
    path = tmp_path / "dicts.pickle"
    path.write_bytes(pickle.dumps([{} for _ in range(3_000_000)], protocol=4))
    _refused(_main(capsys, ["replay", str(path)]), f"{path}: the pickle built ", "objects from its first ",
             f"kvlab allows a file of {path.stat().st_size:,} bytes (0.25 per byte")


def test_the_real_snapshots_build_far_fewer_objects_than_the_bound(tmp_path):
    """The bound leaves room: the example, and a dense generated history without stacks, load."""
    from kvlab.device.snapshot import read_snapshot

    raw = copy.deepcopy(RAW)
    base = raw["device_traces"][0][-1]["time_us"]
    seg = raw["segments"][2]
    for i in range(100_000):  # alloc and free the same free block of a live segment, many times
        raw["device_traces"][0] += [
            {"action": "alloc", "addr": seg["address"], "size": 512 + i % 7, "stream": 0, "time_us": base + 2 * i + 1,
             "frames": []},
            {"action": "free_completed", "addr": seg["address"], "size": 512 + i % 7, "stream": 0,
             "time_us": base + 2 * i + 2, "frames": []}]
    path = tmp_path / "dense.pickle"
    path.write_bytes(pickle.dumps(raw, protocol=4))
    assert len(read_snapshot(path).raw["device_traces"][0]) == 200_022


# ---- item 3: deep nesting -------------------------------------------------------------------------------------

def _nested(kind: str, depth: int) -> bytes:
    """The pickle opcodes of ``depth`` lists (or tuples) around the int 1 (built without recursion)."""
    return b"(" * depth + b"K\x01" + b"l" * depth if kind == "list" else b"K\x01" + b"\x85" * depth


NODES = {"segments[0]": lambda s: s["segments"][0], "segments[0].blocks[0]": lambda s: s["segments"][0]["blocks"][0],
         "device_traces[0][0]": lambda s: s["device_traces"][0][0]}


@pytest.mark.parametrize("where, field", [("segments[0]", "address"), ("segments[0].blocks[0]", "state"),
                                          ("device_traces[0][0]", "time_us"), ("device_traces[0][0]", "addr")])
@pytest.mark.parametrize("kind", ["list", "tuple"])
def test_a_deeply_nested_value_is_named_not_a_recursion_error(where, field, kind, tmp_path, capsys):
    raw = copy.deepcopy(RAW)
    NODES[where](raw)[field] = "MARKER"
    data = pickle.dumps(raw, protocol=2)
    marker = b"X" + struct.pack("<I", 6) + b"MARKER"
    assert data.count(marker) == 1
    path = tmp_path / "deep.pickle"
    path.write_bytes(data.replace(marker, _nested(kind, 200_000)))
    _refused(_main(capsys, ["replay", str(path)]), f"{path}: {where}.{field}: ", f"{kind} {'[[[' if kind == 'list' else '((('}")


def test_a_deeply_nested_tuple_as_a_key_does_not_crash_the_process(tmp_path):
    """hash() of a tuple recurses in C: one nested 300,000 deep as a dict key was a segmentation fault while the
    pickle loaded. Now it loads where the stack holds it, and the unknown key is shown cut short."""
    data = pickle.dumps(RAW, protocol=2)
    top = data.index(b"}") + 1  # the top-level dict, opened first
    path = tmp_path / "deep-key.pickle"
    path.write_bytes(data[:top] + b"K\x01" + b"\x85" * 300_000 + b"K\x02s" + data[top:])
    run = _cli(["replay", str(path)])
    assert run.returncode == 0, (run.returncode, run.stderr[-2000:])
    assert f"kvlab: warning: {path}: ignoring keys kvlab does not know (top level: ((((...),),),))" in run.stderr


# ---- items 5 and 8: snapshots that contradict themselves ------------------------------------------------------

def _grow_last_block(s):
    s["segments"][0]["blocks"][-1]["size"] += 4096


def _move_block_out(s):
    s["segments"][0]["blocks"][0]["address"] = 0x1000


def _free_before_alloc(s):  # the free of a block moved before the alloc that made it, in a segment made empty
    trace = s["device_traces"][0]
    for _ in range(2):
        trace.insert(6, trace.pop(10))


def _double_free(s):
    trace = s["device_traces"][0]
    trace.insert(11, dict(trace[10]))


def _other_device(s):
    for seg in s["segments"]:
        seg["device"] = 1


def _set(field, value):
    def change(s):
        s["segments"][0][field] = value
    return change


@pytest.mark.parametrize("change, where", [
    (_grow_last_block, "segments[0].blocks[3].size: block 0x7f000015b200 + 679,424 B lies outside its segment"),
    (_move_block_out, "segments[0].blocks[0].address: block 0x1000 + 65,536 B lies outside its segment"),
    (_free_before_alloc, "device_traces[0][6]: free_requested at 0x7f0001100000 before any alloc there: event 5 "
                         "allocated its segment 0x7f0000e00000 empty"),
    (_double_free, "device_traces[0][11]: free_completed at 0x7f0001100000, which event 10 freed already"),
    (_other_device, "segments[0].device: device 1, but device_traces holds one trace per device, for device 0 only"),
    (_set("total_size", 0), "segments[0].total_size: 0 bytes"),
    (_set("segment_type", 7), "segments[0].segment_type: expected one of ('small', 'large'), got 7"),
    (_set("segment_type", None), "segments[0].segment_type: expected one of ('small', 'large'), got None"),
    (_set("is_expandable", "yes"), "segments[0].is_expandable: expected True or False, got 'yes'"),
    (_set("is_expandable", 1), "segments[0].is_expandable: expected True or False, got 1"),
    (_set("is_expandable", "False"), "segments[0].is_expandable: expected True or False, got 'False'"),
], ids=["block-past-end", "block-outside", "free-before-alloc", "double-free", "other-device", "total-size-0",
        "segment-type-7", "segment-type-none", "expandable-yes", "expandable-1", "expandable-False-string"])
def test_a_snapshot_that_contradicts_itself_is_refused_naming_the_field(change, where, tmp_path, capsys):
    """Each was replayed with exit 0 and no note (issue 37)."""
    raw = copy.deepcopy(RAW)
    change(raw)
    path = tmp_path / "s.pickle"
    path.write_bytes(pickle.dumps(raw, protocol=4))
    _refused(_main(capsys, ["replay", str(path)]), f"kvlab: error: {path}: {where}")


# ---- items 5 and 6: --what-if ---------------------------------------------------------------------------------

@pytest.mark.parametrize("value, needle", [
    ("", "--what-if '': names no setting"),
    (",,,", "--what-if ',,,': names no setting"),
    ("max_split_size_mb=99999999999999999999", "--what-if 'max_split_size_mb=99999999999999999999': "
                                              "max_split_size_mb takes a whole number of MiB from 20 to 1,073,741,824"),
    ("max_split_size_mb=\u00b2", "--what-if 'max_split_size_mb=\u00b2': max_split_size_mb takes a whole number of "
                                 "MiB from 20 to 1,073,741,824, or -1 / unlimited / none, not '\u00b2'"),
    ("roundup_power2_divisions=\u00b2", "roundup_power2_divisions takes 0 or a power of 2 under 65,536, not '\u00b2'"),
])
def test_a_what_if_that_asks_for_nothing_or_no_number_is_refused(value, needle, capsys):
    """The first three ran as if nothing were asked (exit 0); ``²`` gave "invalid literal for int()"."""
    _refused(_main(capsys, ["replay", str(SNAPSHOT), "--what-if", value]), needle)
