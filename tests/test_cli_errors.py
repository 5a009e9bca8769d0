"""The CLI's one error mapping (kvlab/cli/__init__.py ``main``): a user error is ``kvlab: error:`` and exit 2; a kvlab bug
(a ``KvlabBug`` such as a double free, or any unexpected exception) is one line naming the command and its input,
the path of the saved traceback, and exit 3 -- never a traceback on the terminal, never reported as the user's
mistake."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvlab import cli
from kvlab.errors import DoubleFreeError, InvariantError, KvlabBug, KvlabError, LockRefError
from kvlab.mem_cache import TokenToKVPoolAllocator

REPO = Path(__file__).resolve().parent.parent
SNAPSHOT = REPO / "data" / "snapshots" / "example.pickle"


def _double_free(args) -> int:
    """A subcommand body with a real bug in it: the real allocator, freed twice."""
    pool = TokenToKVPoolAllocator(8)
    slots = pool.alloc(3)
    pool.free(slots)
    pool.free(slots)
    return 0


def _key_error(args) -> int:
    return {}["missing"]


def _recursion(args) -> int:
    return _recursion(args)


@pytest.fixture
def crashes(tmp_path, monkeypatch) -> Path:
    """A crash folder of this test's own: exit 3 is what these tests provoke (tests/conftest.py fails any
    other test whose run saves a traceback)."""
    folder = tmp_path / "crashes"
    monkeypatch.setenv("KVLAB_CRASH_DIR", str(folder))
    return folder


def test_the_bug_classes_are_never_user_errors():
    for bug in (InvariantError, DoubleFreeError, LockRefError):
        assert issubclass(bug, KvlabBug) and not issubclass(bug, KvlabError), bug
        assert not issubclass(bug, cli.USER_ERRORS) or issubclass(bug, KvlabBug)
    # the builtin bases stay, for code that catches them
    assert issubclass(InvariantError, AssertionError) and issubclass(DoubleFreeError, ValueError)
    assert issubclass(LockRefError, RuntimeError)


@pytest.mark.parametrize("body, name", [(_double_free, "DoubleFreeError"), (_key_error, "KeyError"),
                                        (_recursion, "RecursionError")])
def test_a_bug_exits_3_with_one_line_and_a_saved_traceback(body, name, crashes, monkeypatch, capsys):
    monkeypatch.setitem(cli._COMMANDS, ("replay", None), body)
    code = cli.main(["replay", str(SNAPSHOT)])
    err = capsys.readouterr().err
    assert code == 3, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvlab: internal error: `kvlab replay` failed on "), err
    assert str(SNAPSHOT) in lines[0] and name in lines[0] and "kvlab: error:" not in err
    assert "Traceback" not in err
    saved = list(crashes.iterdir())
    assert len(saved) == 1 and str(saved[0]) in lines[0]
    text = saved[0].read_text()
    assert "Traceback (most recent call last)" in text and name in text and str(SNAPSHOT) in text


def test_a_crash_folder_that_cannot_be_written_still_gives_one_line(tmp_path, monkeypatch, capsys):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    monkeypatch.setenv("KVLAB_CRASH_DIR", str(blocker / "sub"))
    monkeypatch.setitem(cli._COMMANDS, ("replay", None), _double_free)
    assert cli.main(["replay", str(SNAPSHOT)]) == 3
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "could not be saved" in err and "Traceback" not in err


def test_a_user_error_is_still_exit_2_naming_the_input(tmp_path, capsys):
    bad = tmp_path / "not-a-pickle.pickle"
    bad.write_bytes(b"hello")
    assert cli.main(["replay", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("kvlab: error: ") and str(bad) in err and "internal error" not in err


def test_the_real_console_script_exits_3_not_with_a_traceback(crashes):
    """The same path end to end through ``python -m kvlab``: a subcommand that breaks prints one line."""
    code = ("import sys; from kvlab import cli; from kvlab.errors import DoubleFreeError\n"
            "def broken(args):\n    raise DoubleFreeError('double free of slot 1')\n"
            "cli._COMMANDS[('replay', None)] = broken\nsys.exit(cli.main())")
    proc = subprocess.run([sys.executable, "-c", code, "replay", str(SNAPSHOT)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.count("\n") == 1
    assert "DoubleFreeError: double free of slot 1" in proc.stderr and len(list(crashes.iterdir())) == 1


LOG = REPO / "data" / "examples" / "server_logs" / "llama-3.1-8b-h100-sglang-0.5.23.log"


def _file_inputs(where: Path) -> list[tuple[list[str], str]]:
    """(argv, the name the error must give) for every subcommand input that must be a file, given ``where``."""
    return [
        (["replay", str(where)], f"{where}:"),
        (["simulate", "--trace", str(where)], f"--trace {where}:"),
        (["sweep", "--trace", str(where), "--kv-pages", "30"], f"--trace {where}:"),
        (["explain-log", str(where)], f"{where}:"),
        (["explain-log", str(LOG), "--compare-engines", "--vllm-log", str(where)], f"--vllm-log {where}:"),
    ]


def test_a_folder_where_a_file_goes_says_so(tmp_path, capsys):
    folder = tmp_path / "inputs.pickle"
    folder.mkdir()
    for argv, name in _file_inputs(folder):
        assert cli.main(argv) == 2, argv
        err = capsys.readouterr().err
        assert err == f"kvlab: error: {name} is a folder, not a file; give the file itself\n", (argv, err)
    for argv in (["report", "--notebook-dir", str(LOG), "--out", str(tmp_path / "r")],
                 ["app", "--notebook-dir", str(LOG), "--no-browser"]):
        assert cli.main(argv) == 2
        assert f"--notebook-dir {LOG}: is a file, not a folder" in capsys.readouterr().err
    assert not (tmp_path / "r").exists()


def test_a_fifo_or_a_device_is_refused_at_once(tmp_path):
    """A FIFO blocked the readers forever and /dev/zero never ends: both are refused before reading. (One child
    process runs every case through ``cli.main``, so a reader that blocks fails the test by its timeout.)"""
    fifo = tmp_path / "trace.jsonl"
    os.mkfifo(fifo)
    cases = [case for where in (fifo, Path("/dev/zero")) for case in _file_inputs(where) + [
        (["explain-log", str(LOG), "--model-config", str(where)], f"--model-config {where}:")]]
    script = ("import json, sys\nfrom kvlab.cli import main\n"
              "for argv in json.loads(sys.argv[1]):\n    print(main(argv), flush=True, file=sys.stderr)\n")
    proc = subprocess.run([sys.executable, "-c", script, json.dumps([argv for argv, _ in cases])],
                          capture_output=True, text=True, timeout=120)
    lines = proc.stderr.splitlines()
    assert proc.returncode == 0 and len(lines) == 2 * len(cases), proc.stderr
    for (argv, name), (message, code) in zip(cases, zip(lines[::2], lines[1::2])):
        assert code == "2" and message.startswith(f"kvlab: error: {name} is not a regular file"), (argv, message)
