"""Text from user files is shown, not obeyed: a config's ``_name_or_path``, a snapshot's unknown key, a trace's file
name holding ``ESC[2J`` (clear the screen) or ``ESC]0;`` (retitle the window) reach the terminal as the escape
``\\x1b[2J``, in every command that prints them. The files here are real files written with those bytes."""

from __future__ import annotations

import json
import pickle
import shutil

import pytest

from kvlab import cli
from kvlab.device.snapshot import load_snapshot_pickle
from kvlab.safe_text import printable
from tests.conftest import REPO_ROOT

CLEAR = "\x1b[2J\x1b[H"  # clear the screen, cursor home: what an attacker prints before a fake "all checks passed"
CONTROLS = ("\x1b", "\x07", "\x9b", "\r", "\u202e")


def _no_controls(text: str) -> None:
    assert not any(c in text for c in CONTROLS), repr(text)


def test_printable_escapes_every_control_and_keeps_the_rest():
    assert printable(f"evil{CLEAR}name\r\x07\x9b\u202e\x7f") == "evil\\x1b[2J\\x1b[Hname\\r\\x07\\x9b\\u202e\\x7f"
    assert printable("Qwen3-235B · ünïcode 模型") == "Qwen3-235B · ünïcode 模型"
    assert printable("two\nlines\tand tab") == "two\\nlines\\tand tab"  # a one-line value cannot start a line
    assert printable("two\nlines\tand tab\x1b", lines=True) == "two\nlines\tand tab\\x1b"


def _run(capsys, *args) -> tuple[int, str, str]:
    code = cli.main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_explain_log_shows_a_config_names_escapes(tmp_path, capsys):
    config = json.loads((REPO_ROOT / "data/examples/models/qwen3-235b-a22b-fp8/config.json").read_text())
    config["_name_or_path"] = f"evil{CLEAR}\x1b]0;owned\x07model"
    path = tmp_path / "config.json"
    path.write_text(json.dumps(config))
    log = REPO_ROOT / "data/examples/server_logs/qwen3-235b-fp8-4xh100-sglang-0.4.9.log"
    code, out, err = _run(capsys, "explain-log", log, "--model-config", path)
    assert code == 0, err
    _no_controls(out + err)
    assert "evil\\x1b[2J\\x1b[H\\x1b]0;owned\\x07model" in out


def test_replay_shows_an_unknown_snapshot_keys_escapes(tmp_path, capsys):
    raw = load_snapshot_pickle(REPO_ROOT / "data/snapshots/example.pickle")
    raw[f"x{CLEAR}all checks passed"] = 1
    path = tmp_path / "snapshot.pickle"
    path.write_bytes(pickle.dumps(raw, protocol=4))
    code, out, err = _run(capsys, "replay", path)
    assert code == 0, err
    _no_controls(out + err)
    assert "x\\x1b[2J\\x1b[Hall checks passed" in err


def test_simulate_and_sweep_show_a_trace_names_escapes(tmp_path, capsys):
    trace = tmp_path / f"trace{CLEAR}\u202e.jsonl"
    shutil.copy(REPO_ROOT / "data/traces/mooncake_tiny.jsonl", trace)
    code, out, err = _run(capsys, "simulate", "--trace", trace, "--kv-pages", "30")
    assert code == 0, err
    _no_controls(out + err)
    assert "trace\\x1b[2J\\x1b[H\\u202e.jsonl" in out
    code, out, err = _run(capsys, "sweep", "--trace", trace, "--kv-pages", "30", "--workers", "1")
    assert code == 0, err
    _no_controls(out + err)
    assert "trace\\x1b[2J\\x1b[H\\u202e.jsonl" in out


@pytest.mark.parametrize("command", ["simulate", "sweep"])
def test_an_error_naming_a_file_shows_its_escapes(tmp_path, capsys, command):
    code, out, err = _run(capsys, command, "--trace", tmp_path / f"gone{CLEAR}.jsonl")
    assert code == 2
    _no_controls(out + err)
    assert "gone\\x1b[2J\\x1b[H.jsonl" in err
