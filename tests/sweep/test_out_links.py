"""``kvlab sweep --out`` refuses a symbolic link (to a file, a folder, or nothing) and a file with other hard links,
before any point runs, and again where the file is opened: the link and what it points at are left exactly as they
were (a completed sweep replaces its file, which used to turn the link into a file of its own, create a dangling
link's target elsewhere first, or split a hard-linked file in two)."""

from __future__ import annotations

import os

import pytest

from kvlab.cli import main
from kvlab.sweep.grid import SweepError
from kvlab.sweep.store import open_row_file

from .conftest import TINY

SWEEP = ["sweep", "--trace", str(TINY), "--kv-pages", "30"]


@pytest.fixture(scope="module")
def sweep_csv(tmp_path_factory) -> bytes:
    """The bytes of a finished sweep's CSV: a file the sweep would happily add to, so only the link stops it."""
    out = tmp_path_factory.mktemp("real") / "rows.csv"
    assert main(SWEEP + ["--out", str(out)]) == 0
    return out.read_bytes()


def _state(folder) -> dict:
    """Every entry under ``folder``: a link's target text, a file's bytes, a folder's marker (and the inode, so a
    file replaced by an equal copy shows)."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in dirs + files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            if os.path.islink(path):
                found[path] = ("link", os.readlink(path), info.st_ino)
            elif os.path.isdir(path):
                found[path] = ("folder", info.st_ino)
            else:
                with open(path, "rb") as f:
                    found[path] = ("file", f.read(), info.st_ino, info.st_nlink)
    return found


def _cases(tmp_path, sweep_csv: bytes) -> list[tuple[str, str]]:
    real = tmp_path / "real.csv"
    real.write_bytes(sweep_csv)
    (tmp_path / "to-file.csv").symlink_to(real)
    (tmp_path / "dangling.csv").symlink_to(tmp_path / "elsewhere" / "made.csv")
    (tmp_path / "dir").mkdir()
    (tmp_path / "to-folder.csv").symlink_to(tmp_path / "dir")
    shared = tmp_path / "shared.csv"
    shared.write_bytes(sweep_csv)
    os.link(shared, tmp_path / "hard.csv")
    return [("to-file.csv", "is a symbolic link to "), ("dangling.csv", "is a symbolic link to "),
            ("to-folder.csv", "is a symbolic link to "), ("hard.csv", "has 2 hard links")]


def test_a_linked_out_is_refused_and_left_as_it_was(tmp_path, sweep_csv, capsys):
    cases = _cases(tmp_path, sweep_csv)
    before = _state(tmp_path)
    for name, why in cases:
        out = tmp_path / name
        assert main(SWEEP + ["--out", str(out)]) == 2, name
        err = capsys.readouterr().err
        assert err.startswith(f"kvlab: error: --out {out}: {why}") and err.count("\n") == 1, err
        assert ("real file's path" in err) if "symbolic" in why else ("give a file with one name" in err), err
    assert _state(tmp_path) == before  # no link replaced, no target created, no hard link split, no stray file
    assert not (tmp_path / "elsewhere").exists()


def test_run_sweep_refuses_a_linked_out_too(tmp_path, sweep_csv):
    """The Python entry point (``run_sweep``, ``open_row_file``) checks the same, without the CLI's first check."""
    cases = _cases(tmp_path, sweep_csv)
    before = _state(tmp_path)
    for name, why in cases:
        with pytest.raises(SweepError, match=why):
            open_row_file(tmp_path / name, write=True)
    assert _state(tmp_path) == before


def test_an_out_swapped_for_a_link_mid_sweep_is_not_written_through(tmp_path, sweep_csv):
    """Checked where the file is opened (``O_NOFOLLOW``, ``fstat``), not only before the sweep starts: a link put in
    the file's place while the sweep runs stops the next row instead of writing through it."""
    out, victim = tmp_path / "rows.csv", tmp_path / "victim.csv"
    victim.write_bytes(sweep_csv)
    store = open_row_file(out, write=True)
    try:
        row = dict(open_row_file(victim).rows[0])
        out.unlink()
        out.symlink_to(victim)
        with pytest.raises(SweepError, match="is a symbolic link"):
            store.append(row, lambda: [row])
        out.unlink()
        os.link(victim, out)
        with pytest.raises(SweepError, match="has 2 hard links"):
            store.append(row, lambda: [row])
    finally:
        store.close()
    assert victim.read_bytes() == sweep_csv
