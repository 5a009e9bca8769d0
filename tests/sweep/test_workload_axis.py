"""``kvlab sweep --workload-axis``: multiturn's parameters (bench_multiturn.py's names) as axes; each row is what
``kvlab simulate --json`` prints for that setting (the closed loop's sender settings reach every point)."""

from __future__ import annotations

import json

import pytest

from kvlab.cli import main

BASE = ["--workload", "multiturn", "--workload-param", "num_rounds=3", "--workload-param", "request_length=64",
        "--workload-param", "output_length=4", "--workload-param", "enable_round_barrier=true"]


def test_axes_rows_equal_simulate(capsys):
    assert main(["sweep", *BASE, "--workload-axis", "num_clients=2,5", "--workload-axis", "max_parallel=1,4",
                 "--page-size", "16", "--kv-tokens", "1024", "--eviction", "shortfall", "--workers", "1",
                 "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert len(rows) == 4
    seen = set()
    for row in rows:
        params = json.loads(row["source"].partition(" ")[2])
        seen.add((params["num_clients"], params["max_parallel"]))
        args = [a for k, v in params.items() for a in ("--workload-param", f"{k}={json.dumps(v)}")]
        assert main(["simulate", "--workload", "multiturn", *args, "--page-size", "16", "--kv-tokens", "1024",
                     "--json"]) == 0
        simulated = json.loads(capsys.readouterr().out)
        assert row["simulated_s"] == simulated["simulated_s"] and row["hit_rate"] == simulated["hit_rate"]
    assert seen == {(2, 1), (2, 4), (5, 1), (5, 4)}


def test_axes_into_one_file_resume_in_axis_order(tmp_path, capsys):
    import csv

    out = tmp_path / "rows.csv"
    argv = ["sweep", *BASE, "--workload-axis", "num_clients=2,3,4", "--page-size", "16", "--kv-tokens", "1024",
            "--eviction", "shortfall", "--workers", "1", "--out", str(out)]
    assert main(argv) == 0
    assert "3 workload settings" in capsys.readouterr().out
    sources = [json.loads(r["source"].partition(" ")[2])["num_clients"] for r in csv.DictReader(out.open())]
    assert sources == [2, 3, 4]
    assert main(argv) == 0
    assert "3 points (3 already in rows.csv): 0 computed" in capsys.readouterr().out


@pytest.mark.parametrize(("args", "message"), [
    (["--workload-axis", "num_clients"], "--workload-axis 'num_clients': expected KEY=LIST"),
    (["--workload-axis", "num_rounds=2,3"], "--workload-axis num_rounds: given twice"),
    (["--workload-axis", "max_parallel=0,2"], "max_parallel"),
])
def test_bad_axes_exit_2(args, message, capsys):
    assert main(["sweep", *BASE, *args, "--page-size", "16", "--kv-tokens", "1024", "--workers", "1"]) == 2
    assert message in capsys.readouterr().err
