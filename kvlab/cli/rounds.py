"""The multi-turn benchmark's per-round table, as ``bench_multiturn.py`` prints it (``kvlab simulate --workload
multiturn``; ``--compare-table`` prints it beside a published one)."""

from __future__ import annotations

from kvlab.safe_text import printable


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
    """The script's lines: ``Round r: Average TTFT = …s, Cache Hit Rate = … (n requests, m clients)``, each with
    where its cached tokens were found (device / host / storage)."""
    if not rounds:
        return
    print("Per-round metrics (TTFT on the modelled clock; cached tokens found on device / host / storage):")
    for row in rounds:
        print(f"  Round {row['round']}: Average TTFT = {row['avg_ttft_s']:.2f}s, Cache Hit Rate = "
              f"{row['cache_hit_rate']:.6f} ({row['requests']} requests, {row['clients']} clients) · hits "
              f"{row['device_hit_tokens']:,} / {row['host_hit_tokens']:,} / {row['storage_hit_tokens']:,}")


def print_table_comparison(comparison) -> None:
    """``kvlab simulate --compare-table``: the settings, every value that is not the table's own, and the rounds
    measured beside simulated."""
    data = comparison.as_dict()
    print(f"compare-table · {printable(comparison.plan.title)} · {printable(data['source'])}")
    w = data["workload"]
    print("bench: " + ", ".join(f"{k} {printable(str(v))}" for k, v in w.items()) + f", seed {data['seed']}")
    host = f" · host tier {data['host_tier']}" if data["host_tier"] else ""
    if "hicache_storage_backend" in comparison.plan.config:  # (the storage tier ran)
        host += " · storage " + " ".join(f"{flag} {printable(str(v))}" for flag, v in data["storage_flags"].items())
    print(f"server: page size {data['page_size']} · device pool {data['kv_tokens']:,} tokens{host} · eviction "
          f"{data['eviction']} · policy {data['policy']}")
    print(f"device pool: {printable(data['device_pool'])}")
    for note in data["notes"]:
        print(f"  note: {printable(note)}")
    print(f"{'round':>5}  {'requests':>8}  {'measured hit':>12}  {'simulated hit':>13}  {'difference':>10}  "
          f"{'measured TTFT':>13}  {'simulated TTFT':>14}")
    for row in data["rounds"]:
        sim = row["simulated_cache_hit_rate"]
        diff = f"{sim - row['measured_cache_hit_rate']:+.6f}" if sim is not None else "-"
        ttft = row["measured_avg_ttft_s"]
        print(f"{row['round']:>5}  {row['requests']:>8}  {row['measured_cache_hit_rate']:>12.6f}  "
              f"{'-' if sim is None else f'{sim:.6f}':>13}  {diff:>10}  "
              f"{'-' if ttft is None else f'{ttft:.2f}s':>13}  "
              f"{'-' if row['simulated_avg_ttft_s'] is None else format(row['simulated_avg_ttft_s'], '.2f') + 's':>14}")
    print("(TTFT: measured on the server's clock, simulated on kvlab's modelled clock; compare the hit rates)")
