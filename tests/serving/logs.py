"""Helpers for the explain-log tests: write a rendered or recorded log to a temp file, run the CLI."""

from __future__ import annotations

import json

from kvlab import cli


def write_log(tmp_path, text: str, name: str = "server.log"):
    path = tmp_path / name
    path.write_text(text)
    return path


def run_cli(capsys, *args) -> tuple[int, str, str]:
    code = cli.main(["explain-log", *map(str, args)])
    out = capsys.readouterr()
    return code, out.out, out.err


def run_json(capsys, *args) -> dict:
    code, out, err = run_cli(capsys, *args, "--json")
    assert code == 0, err
    return json.loads(out)
