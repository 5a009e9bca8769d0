"""Cost of ``evict(1)`` with 5,000 evictable leaves: kvlab's incremental heap vs SGLang's rebuild.

SGLang's ``RadixCache.evict`` snapshots every evictable leaf and heapifies them on each call, so
``evict(1)`` costs O(leaves) (about 6.8 ms at 5,000 leaves: docs/semantics.md#cost-of-the-upstream-tree). kvlab keeps
the heap across calls (lazy invalidation), so a call costs O(log leaves) per victim.

Tree: 50 shared 32-token prefixes x 100 distinct 8-token tails = 5,000 leaves; a random tenth of
the leaves is matched again (recency), a random tenth re-inserted (hit counts), priorities 0-2.
Both sides use a logical clock and a recording allocator (the cost measured is the tree's), and
must evict the same leaves in the same order, for every policy.

    python benchmarks/bench_eviction.py [--calls 200] [--policies lru,lfu,...] [--sglang 0.5.23]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import time
from pathlib import Path

import torch

from kvlab.mem_cache import RadixCache

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "tests" / "reference" / "sglang_driver.py"
TARGET = 50.0
POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority")


def workload(seed: int = 0, n_prefixes: int = 50, tails: int = 100, prefix_len: int = 32, tail_len: int = 8):
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1, 32000) for _ in range(prefix_len)] for _ in range(n_prefixes)]
    leaves = []
    for p in prefixes:
        firsts = rng.sample(range(1, 32000), tails)  # distinct first tail token: distinct leaves
        leaves += [p + [f] + [rng.randrange(1, 32000) for _ in range(tail_len - 1)] for f in firsts]
    rng.shuffle(leaves)
    n = len(leaves)
    return {
        "leaves": leaves,
        "priorities": [rng.randrange(3) for _ in range(n)],
        "touch": rng.sample(range(n), n // 10),
        "reinsert": rng.sample(range(n), n // 10),
    }


class RecordingAllocator:
    page_size = 1

    def __init__(self):
        self.freed = []

    def free_segment(self, idx, *, start_pos=0):
        self.freed.append(int(idx[0]))


def run_kvlab(spec, policy: str, calls: int):
    rec = RecordingAllocator()
    cache = RadixCache(token_to_kv_pool_allocator=rec, eviction_policy=policy)
    off = 1
    for s, prio in zip(spec["leaves"], spec["priorities"]):
        cache.insert(s, torch.arange(off, off + len(s)), priority=prio)
        off += len(s)
    for i in spec["touch"]:
        cache.match_prefix(spec["leaves"][i])
    for i in spec["reinsert"]:
        cache.insert(spec["leaves"][i], torch.zeros(len(spec["leaves"][i]), dtype=torch.int64))
    n_leaves = len(cache.evictable_leaves)
    t0 = time.perf_counter()
    for _ in range(calls):
        cache.evict(1)
    dt = time.perf_counter() - t0
    cache.check_invariants()
    return {"seconds": dt, "evictable_leaves": n_leaves, "victims": rec.freed}


def run_sglang(version: str, spec, policies, calls: int):
    """One driver process for all policies (SGLang's import alone takes ~20 s)."""
    py = Path(os.environ.get("KVLAB_REF_DIR", REPO / ".ref")) / f"sglang-{version}" / "bin" / "python"
    if not py.exists():
        return None
    out = subprocess.run([str(py), str(DRIVER), "--bench-evict"],
                         input=json.dumps({**spec, "policies": list(policies), "calls": calls}),
                         capture_output=True, text=True, cwd=REPO, check=False)
    if out.returncode:
        raise SystemExit(f"sglang driver failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--policies", default=",".join(POLICIES))
    ap.add_argument("--sglang", default="0.5.23", help="reference venv version under .ref/")
    ap.add_argument("--check-target", action="store_true", help=f"exit 1 below {TARGET:.0f}x")
    a = ap.parse_args()
    spec = workload()
    print(f"tree: {len(spec['leaves'])} leaves of 8 tokens under 50 shared 32-token prefixes; "
          f"{a.calls} x evict(1) per policy")
    print(f"{'policy':9} {'leaves':>6} {'kvlab us/call':>14} {'sglang us/call':>15} {'ratio':>8}  same victims")
    policies = a.policies.split(",")
    sglang = run_sglang(a.sglang, spec, policies, a.calls)
    have_ref = sglang is not None
    worst, all_same = float("inf"), True
    for policy in policies:
        mine = run_kvlab(spec, policy, a.calls)
        k_us = mine["seconds"] / a.calls * 1e6
        if not have_ref:
            print(f"{policy:9} {mine['evictable_leaves']:>6} {k_us:>14.1f} {'-':>15} {'-':>8}  -")
            continue
        ref = sglang["results"][policy]
        s_us = ref["seconds"] / a.calls * 1e6
        same = ref["victims"] == mine["victims"] and ref["evictable_leaves"] == mine["evictable_leaves"]
        all_same &= same
        worst = min(worst, s_us / k_us)
        print(f"{policy:9} {mine['evictable_leaves']:>6} {k_us:>14.1f} {s_us:>15.1f} {s_us / k_us:>7.0f}x  {same}")
    if not have_ref:
        print(f"SGLang {a.sglang}: reference venv missing; run .ci/setup_reference.sh for the comparison")
        return
    print(f"SGLang {sglang['version']}; worst ratio {worst:.0f}x (target >= {TARGET:.0f}x: "
          f"{'met' if worst >= TARGET else 'NOT met'}); same victims for every policy: {all_same}")
    if not all_same:
        raise SystemExit("kvlab and SGLang evicted different leaves")
    if a.check_target and worst < TARGET:
        raise SystemExit(1)


if __name__ == "__main__":
    sys.exit(main())
