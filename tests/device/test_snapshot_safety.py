"""Reading a snapshot never runs code from it: a pickle that names a global (the way a pickle reaches
``os.system``, ``eval``, ``subprocess.Popen``, any class's ``__reduce__``) or a persistent id is refused
with an error naming the file and the ``module.name``; real ``_dump_snapshot`` pickles, which name no
global at all, still load to exactly what ``pickle.load`` gives.

Each malicious pickle's payload creates a marker file. The test reads it with kvlab first (refused, no
marker), then with a plain ``pickle.load`` (marker appears): so the payload is live, and its absence
after kvlab's read means kvlab did not run it.
"""

from __future__ import annotations

import builtins
import io
import os
import pickle
import pickletools
import re
import subprocess
from pathlib import Path

import pytest

from kvlab.device.snapshot import EXAMPLE_SNAPSHOT, SnapshotError, read_snapshot
from kvlab.errors import KvlabError
from tests.conftest import REPO_ROOT
from tests.shared_data import real_snapshots, shared_dir

SHARED = shared_dir()
REAL_SNAPSHOTS = real_snapshots()


# ---- malicious pickles ------------------------------------------------------------------------------------


class _Payload:
    """Pickles as ``call(*args)``: what a crafted snapshot would carry."""

    def __init__(self, call, *args):
        self.call, self.args = call, args

    def __reduce__(self):
        return self.call, self.args


def _payloads(marker: Path) -> dict:
    m = str(marker)
    return {
        "os.system": _Payload(os.system, f"touch '{m}'"),
        "builtins.exec": _Payload(builtins.exec, f"open({m!r}, 'w').close()"),
        "builtins.eval": _Payload(builtins.eval, f"open({m!r}, 'w').close()"),
        "subprocess.Popen": _Payload(subprocess.Popen, ["touch", m]),
    }


def _globals_named(data: bytes) -> list[str]:
    """The ``module.name`` of every global the pickle names, read from its opcodes (not by loading it)."""
    names, strings = [], []
    for op, arg, _ in pickletools.genops(data):
        if op.name == "GLOBAL":
            names.append(arg.replace(" ", "."))
        elif op.name == "STACK_GLOBAL":
            names.append(".".join(strings[-2:]))
        if isinstance(arg, str):
            strings.append(arg)
    return names


@pytest.mark.parametrize("protocol", [0, 2, 5])
@pytest.mark.parametrize("kind", ["os.system", "builtins.exec", "builtins.eval", "subprocess.Popen"])
def test_code_in_a_pickle_is_refused_and_never_runs(tmp_path, kind, protocol):
    marker = tmp_path / "payload_ran"
    payload = _payloads(marker)[kind]
    data = pickle.dumps({"segments": [], "device_traces": [[payload]]}, protocol=protocol)
    named = _globals_named(data)
    assert len(named) == 1 and named[0].endswith("." + kind.split(".")[1])  # e.g. posix.system, __builtin__.exec
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(data)

    with pytest.raises(SnapshotError) as info:
        read_snapshot(path)
    assert str(info.value).startswith(f"{path}: refused global {named[0]}: not a torch memory snapshot")
    assert isinstance(info.value, KvlabError) and isinstance(info.value, ValueError)
    assert not marker.exists()

    # The control: the same file through plain pickle.load does run the payload.
    with path.open("rb") as f:
        loaded = pickle.load(f)
    result = loaded["device_traces"][0][0]
    if isinstance(result, subprocess.Popen):
        assert result.wait(timeout=30) == 0
    assert marker.exists()


def test_a_bare_global_and_a_class_are_refused(tmp_path):
    """No REDUCE needed to be refused: naming a global at all is enough (a class, a function object)."""
    for obj, name in ((subprocess.Popen, "subprocess.Popen"), (pickle.Unpickler, "_pickle.Unpickler"),
                      (_Payload, f"{__name__}._Payload")):
        path = tmp_path / "global.pickle"
        path.write_bytes(pickle.dumps({"segments": [obj]}, protocol=4))
        with pytest.raises(SnapshotError, match=rf"^{re.escape(str(path))}: refused global {re.escape(name)}:"):
            read_snapshot(path)


class _WithPersistentId(pickle.Pickler):
    def persistent_id(self, obj):
        return ("storage", "0") if obj == "tensor" else None


@pytest.mark.parametrize("protocol", [0, 2, 5])
def test_persistent_ids_are_refused(tmp_path, protocol):
    buf = io.BytesIO()
    _WithPersistentId(buf, protocol=protocol).dump({"segments": ["tensor"]})
    path = tmp_path / "with_pid.pickle"
    path.write_bytes(buf.getvalue())
    with pytest.raises(SnapshotError, match=rf"^{re.escape(str(path))}: refused persistent id "):
        read_snapshot(path)


def test_torch_save_checkpoint_is_refused(tmp_path):
    """A torch.save file is not a snapshot either: the zip format is no pickle, the legacy format is a
    sequence of pickles whose first is a magic number."""
    torch = pytest.importorskip("torch")
    legacy = tmp_path / "legacy.pt"
    torch.save({"w": torch.zeros(3)}, legacy, _use_new_zipfile_serialization=False)
    with pytest.raises(SnapshotError, match=rf"^{re.escape(str(legacy))}: expected a dict at the top level, got int"):
        read_snapshot(legacy)
    zipped = tmp_path / "new.pt"
    torch.save({"w": torch.zeros(3)}, zipped)
    with pytest.raises(SnapshotError, match=rf"^{re.escape(str(zipped))}: not a pickle file"):
        read_snapshot(zipped)


# ---- real snapshots keep loading --------------------------------------------------------------------------


def _plain_load(path: Path):
    with path.open("rb") as f:  # trusted files: the shipped example and the recordings in ../shared
        return pickle.load(f)


def test_shipped_example_loads_as_pickle_load_does():
    assert EXAMPLE_SNAPSHOT.is_file() and EXAMPLE_SNAPSHOT.is_relative_to(REPO_ROOT / "data")
    assert _globals_named(EXAMPLE_SNAPSHOT.read_bytes()) == []
    assert read_snapshot(EXAMPLE_SNAPSHOT).raw == _plain_load(EXAMPLE_SNAPSHOT)


@pytest.mark.skipif(SHARED is None, reason="../shared/real-data/snapshots is absent (only CI and the project's "
                                           "machines have it; a clone has not)")
def test_real_gpu_snapshots_load_as_pickle_load_does():
    assert len(REAL_SNAPSHOTS) == 3, REAL_SNAPSHOTS
    for path in REAL_SNAPSHOTS:
        assert _globals_named(path.read_bytes()) == [], path
        snapshot = read_snapshot(path)
        plain = _plain_load(path)
        assert snapshot.raw == plain, path
        assert len(snapshot.raw["segments"]) == len(plain["segments"]) > 0
        assert sum(len(t) for t in snapshot.raw["device_traces"]) > 0
