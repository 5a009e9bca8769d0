"""SGLang's multi-turn benchmark (``bench_multiturn.py``) on three KV tiers: notebook 07's section 7.

One setting (:class:`TierSetting`: host ratio, storage prefetch policy, storage capacity, eviction mode) is one
``kvlab simulate --workload multiturn ... --json`` run (:meth:`TierSetting.cli_args` is its command line) of
sglang#33984's benchmark: 20 clients, 9 rounds, request 4096, output 1, round barrier, page 64, on a device pool of
:data:`KV_TOKENS` (too small for the conversations: they grow to ~737k tokens).

- :func:`tier_rounds`: per round, where its hits came from: device, host (loaded back) and storage (read by a
  prefetch, then loaded back), beside the script's hit rate and TTFT (the same numbers as the CLI's ``rounds``).
- :func:`dropoff_frame`, :func:`dropoff_text`: sglang#33984's question, the hit rate's drop below the no-eviction
  ideal, per prefetch policy and host ratio.
- :func:`finding2_frame`, :func:`finding2_table`: finding 2 across three tiers, bug | fix | fix − bug, with storage
  that holds everything and with a small one.
- :func:`published_comparison`: the sglang#33984 table beside kvlab's (``kvlab simulate --compare-table``), from a
  small table file written here with the published numbers and their URL.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass
from pathlib import Path

from kvlab.units import DIFFERENCE, GiB, fmt_points, fmt_signed_int, with_sign

BENCH = dict(num_clients=20, num_rounds=9, request_length=4096, output_length=1, max_parallel=4,
             enable_round_barrier=True)  # sglang#33984's benchmark (max_parallel: the brief's, the issue omits it)
PAGE_SIZE = 64
KV_TOKENS = 122_880  # 1,920 pages: room for ~30 of round 0's prompts, a sixth of the last round's history
SEED = 0
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")  # --hicache-storage-prefetch-policy
HOST_RATIOS = (1.0, 2.0, 4.0)  # the live panel's --hicache-ratio choices
SMALL_STORAGE_GB = 20.0  # finding 2's "storage does not hold everything": a fifth of the benchmark's ~97 GB of KV
TIERS = ("device", "host", "storage")
ISSUE_URL = "https://github.com/sgl-project/sglang/issues/33984"
#: sglang#33984's published "hicache ratio=2" table (Cache Hit Rate per round, 20 requests each) and its settings
PUBLISHED_RATES = (0.0, 0.499939, 0.666558, 0.749863, 0.799844, 0.833164, 0.856964, 0.874813, 0.888696)
PUBLISHED_TTFT_S = (2.55, 3.07, 3.46, 3.85, 4.26, 4.5, 5.18, 5.1, 6.13)


@dataclass(frozen=True, order=True)
class TierSetting:
    """One run: host ratio (0: no host tier), storage prefetch policy ("" : no storage tier), storage capacity in
    decimal GB (0: unbounded, the file backend's default) and eviction mode."""

    host_ratio: float = 2.0
    prefetch_policy: str = "best_effort"
    storage_gb: float = 0.0
    eviction: str = "shortfall"

    def options(self) -> dict:
        """``shortfall_eviction.run``'s keyword arguments (the config ``kvlab simulate`` builds from the flags)."""
        opts: dict = dict(eviction=self.eviction, page_size=PAGE_SIZE, kv_tokens=KV_TOKENS)
        if self.host_ratio:
            opts.update(hicache_ratio=self.host_ratio, hicache_write_policy="write_through")
        if self.host_ratio and self.prefetch_policy:
            opts.update(hicache_storage_backend="file", hicache_storage_prefetch_policy=self.prefetch_policy)
            if self.storage_gb:
                opts["hicache_storage_size_gb"] = self.storage_gb
        return opts

    def cli_args(self) -> list[str]:
        """``kvlab simulate``'s arguments for this run, less ``--json``."""
        args = ["--workload", "multiturn"]
        for key, value in BENCH.items():
            args += ["--workload-param", f"{key}={str(value).lower() if isinstance(value, bool) else value}"]
        args += ["--seed", str(SEED), "--page-size", str(PAGE_SIZE), "--kv-tokens", str(KV_TOKENS),
                 "--eviction", self.eviction]
        if self.host_ratio:
            args += ["--hicache-ratio", f"{self.host_ratio:g}"]
            if self.prefetch_policy:
                args += ["--hicache-storage-backend", "file", "--hicache-storage-prefetch-policy", self.prefetch_policy]
                if self.storage_gb:
                    args += ["--hicache-storage-size", f"{self.storage_gb:g}"]
        return args

    def label(self) -> str:
        if not self.host_ratio:
            return "device only"
        storage = ("" if not self.prefetch_policy else
                   f", storage {'unbounded' if not self.storage_gb else f'{self.storage_gb:g} GB'} "
                   f"({self.prefetch_policy})")
        return f"host ratio {self.host_ratio:g}{storage}"


DEFAULT = TierSetting()  # SGLang's defaults: --hicache-ratio 2, best_effort prefetch, an unbounded file store
_RUNS: dict = {}  # TierSetting -> SimResult: each run once per process
_REQUESTS: list = []


def requests():
    """The benchmark's requests (seeded; made once per process)."""
    if not _REQUESTS:
        from kvlab.workloads.generators import make_workload

        _REQUESTS.append(make_workload("multiturn", seed=SEED, **BENCH))
    return _REQUESTS[0]


def has_run(setting: TierSetting) -> bool:
    """Whether :func:`run` has this setting's run already (a panel says "computing" only when it has not)."""
    return setting in _RUNS


def run(setting: TierSetting = DEFAULT):
    """The setting's ``SimResult`` (cached: a second call returns the same run)."""
    if setting not in _RUNS:
        from kvlab.experiments.shortfall_eviction import run as simulate
        from kvlab.sweep.point import closed_loop_options

        reqs = requests()
        _RUNS[setting] = simulate(reqs, progress=False, **setting.options(), **closed_loop_options(reqs, SEED))
    return _RUNS[setting]


def ideal_rates() -> list[float]:
    """Each round's hit rate with nothing ever evicted: every earlier token cached, page aligned."""
    from kvlab.workloads.multiturn import prompt_length

    out = []
    for r in range(BENCH["num_rounds"]):
        prompt = prompt_length(r, BENCH["request_length"], BENCH["output_length"])
        cached = 0 if r == 0 else prompt_length(r - 1, BENCH["request_length"], BENCH["output_length"]) + 1
        out.append(round((cached // PAGE_SIZE * PAGE_SIZE) / prompt, 6))
    return out


def tier_rounds(result):
    """Per round (a frame): requests, prompt tokens, the hits from each tier (device, host, storage), the script's
    ``cache_hit_rate`` and ``avg_ttft_s``: :func:`kvlab.sched.arrivals.round_metrics`, the CLI's ``rounds``, with
    the no-eviction ideal beside them."""
    import pandas as pd

    from kvlab.sched.arrivals import round_metrics

    keep = ("round", "requests", "prompt_tokens", "device_hit_tokens", "host_hit_tokens", "storage_hit_tokens",
            "cached_tokens", "cache_hit_rate", "avg_ttft_s")
    frame = pd.DataFrame([{k: m.as_dict()[k] for k in keep} for m in round_metrics(result.records)])
    frame["ideal_hit_rate"] = ideal_rates()[: len(frame)]
    return frame


def rounds_table(frame):
    """:func:`tier_rounds` for reading, narrow enough to sit beside its bars: hits per tier as shares of the round's
    prompt tokens, the script's hit rate, the no-eviction ideal and the mean TTFT (s)."""
    import pandas as pd

    share = {tier: (frame[f"{tier}_hit_tokens"] / frame["prompt_tokens"]).map("{:.4f}".format) for tier in TIERS}
    return pd.DataFrame({"round": frame["round"], **share, "hit rate": frame["cache_hit_rate"].map("{:.6f}".format),
                         "ideal": frame["ideal_hit_rate"].map("{:.6f}".format),
                         "TTFT s": frame["avg_ttft_s"].map("{:.2f}".format)}).set_index("round")


# ---- sglang#33984: the drop-off ------------------------------------------------------------------------------------
def dropoff_frame(host_ratios=HOST_RATIOS, policies=PREFETCH_POLICIES):
    """Per (host ratio, prefetch policy), storage unbounded: the first round whose hit rate is below the
    no-eviction ideal (None: none), the last round's rate against its ideal, and the tokens prefetches gave up."""
    import pandas as pd

    ideal = ideal_rates()
    rows = []
    for ratio in host_ratios:
        for policy in policies:
            result = run(TierSetting(ratio, policy))
            frame = tier_rounds(result)
            below = [int(r) for r, rate in zip(frame["round"], frame["cache_hit_rate"]) if rate < ideal[r] - 5e-7]
            rows.append({"host_ratio": ratio, "prefetch_policy": policy, "first_round_below_ideal":
                         below[0] if below else None, "last_round_hit_rate": float(frame["cache_hit_rate"].iloc[-1]),
                         "last_round_ideal": ideal[-1], "storage_hit_tokens": int(frame["storage_hit_tokens"].sum()),
                         "prefetch_aborted_tokens": result.totals()["prefetch_aborted_tokens"],
                         "mean_ttft_s": round(sum(r.ttft_s for r in result.records) / len(result.records), 6)})
    return pd.DataFrame(rows)


def dropoff_text(frame) -> str:
    """sglang#33984's answer, read from :func:`dropoff_frame`'s runs."""
    keep = frame[frame["first_round_below_ideal"].isna()]
    drop = frame[frame["first_round_below_ideal"].notna()]
    parts = [f"Storage holds everything in every run, yet {len(drop)} of {len(frame)} settings fall below the "
             "no-eviction ideal."]
    for policy, group in drop.groupby("prefetch_policy", sort=False):
        where = ", ".join(f"ratio {r:g} from round {int(f)} (last round {h:.3f} against {i:.3f})" for r, f, h, i in
                          zip(group["host_ratio"], group["first_round_below_ideal"], group["last_round_hit_rate"],
                              group["last_round_ideal"]))
        parts.append(f"{policy}: {where}.")
    if len(keep):
        parts.append("On the ideal in every round: " + ", ".join(
            f"{p} at ratio {r:g}" for r, p in zip(keep["host_ratio"], keep["prefetch_policy"])) + ".")
    return " ".join(parts)


# ---- finding 2 across three tiers ----------------------------------------------------------------------------------
STORAGE_CASES = (("storage holds everything", 0.0), (f"storage {SMALL_STORAGE_GB:g} GB", SMALL_STORAGE_GB))
FINDING2_KEYS = ("hit_rate", "storage_hit_tokens", "prefetched_tokens", "prefetch_aborted_tokens",
                 "written_to_storage_tokens", "loaded_back_tokens", "written_to_host_tokens")


def finding2_frame(policy: str = "best_effort", host_ratio: float = 2.0):
    """Both eviction modes with storage that holds everything and with a small one: one row per (case, mode),
    the totals :data:`FINDING2_KEYS`, ``moved_gib`` (host↔device and host↔storage, GiB) and ``mean_ttft_s``."""
    import pandas as pd

    rows = []
    for case, gb in STORAGE_CASES:
        for mode in ("full", "shortfall"):
            result = run(TierSetting(host_ratio, policy, gb, mode))
            t = result.totals()
            moved = (t["loaded_back_tokens"] + t["written_to_host_tokens"] + t["prefetched_tokens"] +
                     t["written_to_storage_tokens"]) * result.config.cost.kv_bytes_per_token / GiB
            rows.append({"case": case, "prefetch_policy": policy, "mode": mode, **{k: t[k] for k in FINDING2_KEYS},
                         "moved_gib": moved,
                         "mean_ttft_s": sum(r.ttft_s for r in result.records) / len(result.records)})
    return pd.DataFrame(rows)


FINDING2_ROWS = (("hit rate", "hit_rate", "pct"), ("storage hits (tokens)", "storage_hit_tokens", "int"),
                 ("prefetched from storage (tokens)", "prefetched_tokens", "int"),
                 ("prefetch gave up (tokens)", "prefetch_aborted_tokens", "int"),
                 ("written to storage (tokens)", "written_to_storage_tokens", "int"),
                 ("GiB moved between tiers", "moved_gib", "gib"), ("mean TTFT (s)", "mean_ttft_s", "s"))


def _fmt(value, kind: str, signed: bool = False) -> str:
    if kind == "pct":
        return fmt_points(value * 100) if signed else f"{value:.2%}"
    if kind == "int":
        return fmt_signed_int(int(value)) if signed else f"{int(value):,}"
    text = f"{abs(value) if signed else value:.{2 if kind == 'gib' else 3}f}"
    return with_sign(text, round(value, 2 if kind == "gib" else 3)) if signed else text


def finding2_table(frame):
    """:func:`finding2_frame` as bug | fix | fix − bug per case (positive: the fix has more), signed."""
    import pandas as pd

    out = {}
    for case in dict.fromkeys(frame["case"]):
        bug = frame[(frame["case"] == case) & (frame["mode"] == "full")].iloc[0]
        fix = frame[(frame["case"] == case) & (frame["mode"] == "shortfall")].iloc[0]
        out[(case, "bug (full)")] = [_fmt(bug[k], kind) for _, k, kind in FINDING2_ROWS]
        out[(case, "fix (shortfall)")] = [_fmt(fix[k], kind) for _, k, kind in FINDING2_ROWS]
        out[(case, DIFFERENCE)] = [_fmt(fix[k] - bug[k], kind, signed=True) for _, k, kind in FINDING2_ROWS]
    return pd.DataFrame(out, index=[label for label, _, _ in FINDING2_ROWS])


def finding2_text(*frames) -> str:
    """What full eviction cost in each :func:`finding2_frame` (one per prefetch policy), read from the runs."""
    parts = []
    for frame in frames:
        for case in dict.fromkeys(frame["case"]):
            arm = frame[frame["case"] == case].set_index("mode")
            policy = arm["prefetch_policy"].iloc[0]
            cols = ["hit_rate", "moved_gib", "mean_ttft_s"]
            d = arm.loc["shortfall", cols] - arm.loc["full", cols]
            parts.append(f"{case}, {policy}: hit rate {DIFFERENCE} {fmt_points(d['hit_rate'] * 100)}, GiB moved "
                         f"{with_sign(f'{abs(d.moved_gib):.2f}', round(d.moved_gib, 2))}, mean TTFT "
                         f"{with_sign(f'{abs(d.mean_ttft_s):.3f}', round(d.mean_ttft_s, 3))} s.")
    return "\n".join(parts)


# ---- the published table beside kvlab's ----------------------------------------------------------------------------
def published_record() -> dict:
    """sglang#33984's "hicache ratio=2" table in ``--compare-table``'s schema: the published rates and TTFTs, the
    issue's settings (request 4096, output 1, page 64 inferred by the curator from the rates; no device pool given)."""
    rows = [{"round": r, "avg_ttft_s": t, "cache_hit_rate": h, "requests": 20, "clients": 20}
            for r, (h, t) in enumerate(zip(PUBLISHED_RATES, PUBLISHED_TTFT_S))]
    return {"id": "sglang-issue-33984-ratio2", "url": ISSUE_URL, "table_label": "hicache ratio=2",
            "server": {"page_size_inferred": 64, "enable_hierarchical_cache": True, "hicache_ratio": 2,
                       "hicache_storage_backend": "mooncake"},
            "bench": {"num_clients": 20, "num_rounds": 9, "request_length_inferred": 4096,
                      "output_length_inferred": 1, "disable_random_sample_inferred": True,
                      "enable_round_barrier": True}, "rows": rows}


TABLE_FILE = "sglang_33984.jsonl"


def write_published_table(path: str | Path) -> Path:
    """Write :func:`published_record` as a one-line table file at ``path`` (refused if it exists: nothing the user
    has is overwritten), for ``kvlab simulate --compare-table PATH`` in a shell."""
    path = Path(path)
    with open(path, "x", encoding="utf-8") as f:
        f.write(json.dumps(published_record()) + "\n")
    return path


def published_comparison():
    """``kvlab simulate --compare-table sglang_33984.jsonl`` on :func:`published_record` (the file written in a
    temporary folder, removed after the run)."""
    from kvlab.experiments.published_tables import compare

    with tempfile.TemporaryDirectory(prefix="kvlab-33984-") as folder:
        return compare(str(write_published_table(Path(folder) / TABLE_FILE)))
