"""Mutation fuzz over every reader through the real CLI (the harness and its rules: tests/cli_fuzz.py).

Snapshots, traces, start-up logs, configs and sweep files, mutated at random (``cli_fuzz`` EXAMPLES entry in
tests/fuzz.py: 2,000 cases under the ``ci`` profile, 20,000 under ``long``): every case ends with exit 0, or
exit 2 and a ``kvlab: error:`` line naming the input; never another exit code, a traceback, a hang or a changed
input file. The seed is fixed per profile, so a failure reproduces with the same ``KVLAB_FUZZ``; a different one
comes from ``KVLAB_FUZZ_SEED``.
"""

from __future__ import annotations

import os
from collections import Counter

import cli_fuzz
import fuzz
import pytest
from shared_data import real_data


@pytest.mark.slow
def test_every_mutated_input_gets_an_answer(tmp_path):
    seed = int(os.environ.get("KVLAB_FUZZ_SEED", "0") or 0)
    count = fuzz.examples("cli_fuzz")
    outcomes = cli_fuzz.run(count, seed, tmp_path, on_case=lambda outcome: fuzz.record("cli_fuzz"))
    assert len(outcomes) == count
    exits = Counter((o.case.kind, o.code) for o in outcomes)
    print(f"cli fuzz, seed {seed}: {count:,} cases; exits by kind: {dict(sorted(exits.items(), key=str))}")
    problems = [o for o in outcomes if o.problem]
    shown = "\n".join(f"  {o.case.kind} · {o.problem} · {o.case.mutation[:120]} · kvlab {' '.join(o.case.argv)[:200]}"
                      f"\n    {(o.err.strip().splitlines() or [''])[-1][:400]}" for o in problems[:20])
    assert not problems, f"{len(problems)} of {count} cases failed (mutated files kept in {tmp_path}):\n{shown}"
    # every kind ran, and both answers (a result and a clear refusal) occurred for each
    for kind in ("snapshot", "trace", "log", "config", "sweep"):
        assert exits[(kind, 0)] and exits[(kind, 2)], (kind, exits)


def test_the_corpus_is_the_real_inputs():
    """The fuzz starts from the shipped inputs, and from ../shared's real snapshots and logs where present."""
    sources = cli_fuzz.snapshot_sources()
    assert sources[0].name == "example.pickle" and all(p.is_file() for p in sources)
    if real_data("snapshots"):
        assert len(sources) >= 3
    assert len(cli_fuzz.config_sources()) >= 2 and cli_fuzz.TRACE.is_file()
