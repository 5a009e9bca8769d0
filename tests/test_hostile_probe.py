"""A small subset of the closing re-run of issue 26 (tests/hostile_probe.py): one probe of each kind per command,
each a process of its own (forked from a warm ``kvlab.cli``): none may end in a traceback, a hang, a user file
changed or lost, or a process left running. The whole run (``python3 tests/hostile_probe.py``) prints the tables."""

from __future__ import annotations

from collections import Counter

import hostile_probe
import pytest


def _subset(all_probes: list) -> list:
    """The first two probes of each (command, category), and every output-path and duplicate probe."""
    seen, chosen = Counter(), []
    for probe in all_probes:
        key = (probe.command, probe.category)
        if seen[key] < 2 or probe.category in ("output-path", "duplicate"):
            seen[key] += 1
            chosen.append(probe)
    return chosen


@pytest.mark.slow
def test_a_subset_of_the_hostile_probes_ends_cleanly(tmp_path, monkeypatch):
    monkeypatch.setenv("KVLAB_PROBE_CRASH_DIR", str(tmp_path / "crashes"))
    (tmp_path / "crashes").mkdir()
    probes = _subset(hostile_probe.probes(tmp_path / "probes", mutations=10))
    assert 40 <= len(probes) <= 100, len(probes)  # (issue 37 added categories: 81 now)
    results = hostile_probe.run(probes, jobs=2, timeout=45)
    counts = Counter(r.outcome for r in results)
    print(f"{len(results)} probes: {dict(counts)}")
    bad = [r for r in results if r.outcome in hostile_probe.BAD_OUTCOMES]
    shown = "\n".join(f"  {r.outcome} · kvlab {' '.join(r.probe.argv)[:160]} · exit {r.code} · "
                      f"{(r.err.strip().splitlines() or [''])[-1][:200]} {r.notes}" for r in bad)
    assert not bad, f"{len(bad)} of {len(results)} probes:\n{shown}"
    assert counts["clear"] >= len(results) // 2, counts  # most are refused, each naming its input
    assert {r.probe.command for r in results} == {"replay", "simulate", "sweep", "explain-log", "report", "app"}
