"""The multi-turn benchmark's per-round table, as ``bench_multiturn.py`` prints it (``kvlab simulate --workload
multiturn``; ``--compare-table`` prints it beside a published one)."""

from __future__ import annotations


def rounds_of(result) -> list[dict]:
    """The run's per-round metrics (:func:`kvlab.sched.arrivals.round_metrics`) as JSON rows; [] for a workload
    without rounds."""
    from kvlab.sched.arrivals import round_metrics

    return [row.as_dict() for row in round_metrics(result.records)]


def totals_with_rounds(result) -> dict:
    """``kvlab simulate --json``: the totals, and the ``rounds`` list when the workload has rounds."""
    totals = result.totals()
    rounds = rounds_of(result)
    return {**totals, "rounds": rounds} if rounds else totals


def print_rounds(rounds: list[dict]) -> None:
    """The script's lines: ``Round r: Average TTFT = …s, Cache Hit Rate = … (n requests, m clients)``."""
    if not rounds:
        return
    print("Per-round metrics (TTFT on the modelled clock):")
    for row in rounds:
        print(f"  Round {row['round']}: Average TTFT = {row['avg_ttft_s']:.2f}s, Cache Hit Rate = "
              f"{row['cache_hit_rate']:.6f} ({row['requests']} requests, {row['clients']} clients)")
