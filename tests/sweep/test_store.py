"""The output file: rows written as points finish, a rerun skips what is there, a kill mid-write costs at most the
row in flight, and a file that is not a sweep's is never written over."""

from __future__ import annotations

import csv

import pytest

from kvlab.sweep import COLUMNS, Grid, SweepError, run_sweep
from kvlab.sweep.store import open_row_file
from kvlab.workloads.mooncake import load_trace

from .conftest import TINY

GRID = Grid(page_sizes=(512,), kv_pages=(7, 12, 30))  # 6 points, a few ms each


@pytest.fixture(scope="module")
def tiny():
    return load_trace(TINY)


@pytest.fixture(scope="module")
def expected(tiny):
    return run_sweep(tiny, GRID, source="tiny", workers=1, progress=False).comparable()


def _csv_rows(path):
    with open(path, newline="") as f:
        return list(csv.reader(f))


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_rows_stream_and_a_rerun_skips_them(tiny, expected, tmp_path, suffix):
    out = tmp_path / f"rows{suffix}"
    seen = []

    def on_row(row, done):  # each row is in the file by the time the next point is reported
        seen.append(row)
        assert len(open_row_file(out).rows) == len(seen)

    half = Grid(page_sizes=(512,), kv_pages=(12,), evictions=("full", "shortfall"))
    first = run_sweep(tiny, half, source="tiny", workers=1, out=out, progress=False, on_row=on_row)
    assert (first.computed, first.skipped) == (2, 0) and len(seen) == 2
    again = run_sweep(tiny, GRID, source="tiny", workers=1, out=out, progress=False)
    assert (again.computed, again.skipped, again.points) == (4, 2, 6)
    assert again.comparable().equals(expected)
    on_disk = open_row_file(out).rows
    assert [r["kv_pages"] for r in on_disk] == [7, 12, 30, 7, 12, 30]  # rewritten in grid order at the end
    assert [r["eviction"] for r in on_disk] == ["shortfall"] * 3 + ["full"] * 3
    assert on_disk == list(again.rows)  # types survive the round trip: ints, floats to the last digit, text
    done = run_sweep(tiny, GRID, source="tiny", workers=1, out=out, progress=False)
    assert (done.computed, done.skipped) == (0, 6)


def test_a_cut_last_line_costs_that_row_only(tiny, expected, tmp_path):
    out = tmp_path / "rows.csv"
    run_sweep(tiny, GRID, source="tiny", workers=1, out=out, progress=False)
    text = out.read_bytes()
    lines = text.splitlines(keepends=True)
    cut = b"".join(lines[:4]) + lines[4][:17]  # header, 3 rows, and a row a kill stopped half-way
    out.write_bytes(cut)
    assert len(open_row_file(out).rows) == 3
    rerun = run_sweep(tiny, GRID, source="tiny", workers=1, out=out, progress=False)
    assert (rerun.computed, rerun.skipped) == (3, 3)
    assert rerun.comparable().equals(expected)
    assert len(_csv_rows(out)) == 7 and all(len(r) == len(COLUMNS) for r in _csv_rows(out))


def test_rows_of_another_grid_are_kept(tiny, tmp_path):
    out = tmp_path / "rows.csv"
    run_sweep(tiny, Grid(page_sizes=(512,), kv_pages=(30,), evictions=("full",)), source="tiny", workers=1,
              out=out, progress=False)
    other = _csv_rows(out)[1]
    run = run_sweep(tiny, Grid(page_sizes=(512,), kv_pages=(7,)), source="other", workers=1, out=out, progress=False)
    assert run.computed == 2  # another source: different points
    assert _csv_rows(out)[-1] == other and len(_csv_rows(out)) == 4


@pytest.mark.parametrize(("name", "content", "message"), [
    ("notes.csv", b"name,size\nalpha,1\n", r"its columns \(name, size\) are not a kvlab sweep's"),
    ("cut.csv", b"just some text", r"its columns \(none\) are not a kvlab sweep's"),
    ("image.csv", b"\x89PNG\r\n\x1a\n\x00\xff\xfe\n", "not UTF-8"),
    ("rows.parquet", b"PAR1 but not really", "not a readable Parquet file"),
])
def test_a_file_that_is_not_a_sweeps_is_refused_untouched(tiny, tmp_path, name, content, message):
    out = tmp_path / name
    out.write_bytes(content)
    with pytest.raises(SweepError, match=message):
        run_sweep(tiny, GRID, source="tiny", workers=1, out=out, progress=False)
    assert out.read_bytes() == content


def test_other_tables_and_damaged_rows_are_refused(tiny, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    theirs = tmp_path / "theirs.parquet"
    pq.write_table(pa.table({"kv_pages": [1, 2], "hit_rate": [0.1, 0.2]}), theirs)
    before = theirs.read_bytes()
    with pytest.raises(SweepError, match=r"--out .*theirs\.parquet: its columns \(kv_pages, hit_rate\)"):
        run_sweep(tiny, GRID, source="tiny", workers=1, out=theirs, progress=False)
    assert theirs.read_bytes() == before
    ours = tmp_path / "rows.csv"
    run_sweep(tiny, GRID, source="tiny", workers=1, out=ours, progress=False)
    lines = ours.read_text().splitlines()
    lines[2] = lines[2].replace(",lru,", ",lru,x,")
    ours.write_text("\n".join(lines) + "\n")
    with pytest.raises(SweepError, match=rf"rows\.csv:3: {len(COLUMNS) + 1} fields, a sweep row has {len(COLUMNS)}"):
        run_sweep(tiny, GRID, source="tiny", workers=1, out=ours, progress=False)
    lines[2] = lines[2].replace(",lru,x,", ",lru,").replace(",512,", ",five-twelve,", 1)
    ours.write_text("\n".join(lines) + "\n")
    with pytest.raises(SweepError, match=r"rows\.csv:3: column 'page_size' holds 'five-twelve'"):
        run_sweep(tiny, GRID, source="tiny", workers=1, out=ours, progress=False)


def test_bad_out_paths(tiny, tmp_path):
    with pytest.raises(SweepError, match=r"unknown format '\.txt'; use a \.csv or \.parquet file"):
        run_sweep(tiny, GRID, out=tmp_path / "rows.txt", workers=1, progress=False)
    (tmp_path / "dir.csv").mkdir()
    with pytest.raises(SweepError, match=r"dir\.csv: is a folder"):
        run_sweep(tiny, GRID, out=tmp_path / "dir.csv", workers=1, progress=False)


# ---- security: the final rewrite and a second writer ----------------------------------------------------------------


def test_the_final_rewrite_follows_no_link_and_destroys_no_file(tiny, tmp_path):
    """The rewrite goes through an unpredictable temporary file created afresh: a symlink (or a file of the user's)
    at the name the old code used, ``.<name>.kvlab-tmp``, is left alone, and nothing else in the folder changes."""
    out = tmp_path / "rows.csv"
    victim = tmp_path / "victim.txt"
    victim.write_text("precious\n")
    (tmp_path / ".rows.csv.kvlab-tmp").symlink_to(victim)
    theirs = tmp_path / ".rows.parquet.kvlab-tmp"
    theirs.write_text("the user's own file\n")
    run_sweep(tiny, GRID, source="tiny", workers=1, out=out, progress=False)
    run_sweep(tiny, GRID, source="tiny", workers=1, out=tmp_path / "rows.parquet", progress=False)
    assert victim.read_text() == "precious\n"
    assert (tmp_path / ".rows.csv.kvlab-tmp").is_symlink()
    assert theirs.read_text() == "the user's own file\n"
    assert len(open_row_file(out).rows) == 6 and len(open_row_file(tmp_path / "rows.parquet").rows) == 6
    assert sorted(p.name for p in tmp_path.iterdir()) == [".rows.csv.kvlab-tmp", ".rows.parquet.kvlab-tmp",
                                                          "rows.csv", "rows.parquet", "victim.txt"]


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_second_sweep_on_the_same_file_is_refused(tiny, tmp_path, suffix):
    """While one sweep writes a file, another on the same file stops with an error naming it (before running a
    point), and the first one's rows are all there at the end; once the first is done, the file is free again."""
    out = tmp_path / f"rows{suffix}"
    refused = []

    def second_writer(row, done):
        if not refused:
            with pytest.raises(SweepError, match=rf"--out {out}: another kvlab sweep is writing to this file") as exc:
                run_sweep(tiny, Grid(page_sizes=(512,), kv_pages=(9,)), source="tiny", workers=1, out=out,
                          progress=False)
            refused.append(exc.value)

    run = run_sweep(tiny, GRID, source="tiny", workers=1, out=out, progress=False, on_row=second_writer)
    assert refused and run.computed == 6
    assert len(open_row_file(out).rows) == 6
    later = run_sweep(tiny, Grid(page_sizes=(512,), kv_pages=(9,)), source="tiny", workers=1, out=out, progress=False)
    assert later.computed == 2 and len(open_row_file(out).rows) == 8


def test_the_rewritten_file_keeps_its_permissions(tiny, tmp_path):
    out = tmp_path / "rows.csv"
    run_sweep(tiny, Grid(page_sizes=(512,), kv_pages=(7,)), source="tiny", workers=1, out=out, progress=False)
    out.chmod(0o640)
    run_sweep(tiny, GRID, source="tiny", workers=1, out=out, progress=False)
    assert out.stat().st_mode & 0o777 == 0o640
