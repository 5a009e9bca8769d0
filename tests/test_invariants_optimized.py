"""Invariant checks survive ``python -O``.

``python -O`` strips ``assert`` statements, so a ``check_invariants()`` built on them checks nothing
there. Each case below builds one real allocator / pool / cache / scheduler, checks it is consistent,
corrupts one of its internal fields the way a bug would, and expects ``check_invariants()`` (or, for the
allocator model's free path, the guard inside ``free``) to raise :class:`kvlab.errors.InvariantError`
naming the broken rule. The cases run in a child ``python -O`` process (this file run as a script),
which reports each outcome as JSON.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from kvlab.errors import InvariantError
from kvlab.units import MiB

REPO_ROOT = Path(__file__).resolve().parent.parent


# ---- the cases (run in the child) -----------------------------------------------------------------
# Each returns (check, corrupt[, act]): ``check()`` must pass; after ``corrupt()``, ``act()`` (by default
# ``check()`` again) must raise.


def _caching_allocator():
    from kvlab.device.caching_allocator import CachingAllocatorModel

    a = CachingAllocatorModel(512 * MiB)
    block = a.malloc(5 * MiB)  # splits a 20 MiB segment: a free block follows it

    def corrupt():
        block.size += 512  # now overlaps the free block after it

    return a.check_invariants, corrupt


def _caching_allocator_free_path():
    """The guards inside malloc/free (stat updates) raise too, not only check_invariants."""
    from kvlab.device.caching_allocator import CachingAllocatorModel

    a = CachingAllocatorModel(512 * MiB)
    block = a.malloc(5 * MiB)
    stats = a._stats["allocated_bytes"]

    def corrupt():
        stats["large_pool"].current = 0  # the books forget the live block

    return a.check_invariants, corrupt, lambda: a.free(block)


def _simulated_gpu():
    from kvlab.device.simulated import SimulatedGPU
    from kvlab.device.spec import DEVICE_PRESETS

    gpu = SimulatedGPU(DEVICE_PRESETS["l4"])
    tensor = gpu.empty((1024, 1024), torch.float32)  # 4 MiB: one block in a 20 MiB segment

    def corrupt():
        gpu.allocator._stats["reserved_bytes"]["large_pool"].current += 2 * MiB

    def check():
        gpu.check_invariants()
        return tensor  # the closure keeps the tensor, and so its block, alive

    return check, corrupt


def _token_allocator():
    from kvlab.mem_cache import TokenToKVPoolAllocator

    a = TokenToKVPoolAllocator(8)
    a.alloc(2)

    def corrupt():
        a.free_pages = torch.cat([a.free_pages, a.free_pages[:1]])

    return a.check_invariants, corrupt


def _paged_allocator():
    from kvlab.mem_cache import PagedTokenToKVPoolAllocator

    a = PagedTokenToKVPoolAllocator(32, 4)
    kv = a.alloc(8)

    def corrupt():
        a._page_pending[int(kv[0]) // 4] = True  # pending, yet no free group is open

    return a.check_invariants, corrupt


def _swa_allocator():
    from kvlab.mem_cache import SWATokenToKVPoolAllocator

    a = SWATokenToKVPoolAllocator(16, 8, page_size=1)
    kv = a.alloc(4)
    free_full = next(s for s in range(1, 17) if s not in set(kv.tolist()))

    def corrupt():
        a.full_to_swa_index_mapping[free_full] = 3  # a free full slot still points at an SWA slot

    return a.check_invariants, corrupt


def _req_to_token_pool():
    from kvlab.mem_cache import ReqToTokenPool

    pool = ReqToTokenPool(4, 16)

    def corrupt():
        pool.free_slots.append(pool.free_slots[0])

    return pool.check_invariants, corrupt


def _kv_pool():
    from kvlab.mem_cache import MHATokenToKVPool

    pool = MHATokenToKVPool(16, 1, torch.bfloat16, head_num=2, head_dim=4, layer_num=3)

    def corrupt():
        pool.k_buffer.pop()

    return pool.check_invariants, corrupt


def _mamba_pool():
    from kvlab.mem_cache import MambaPool

    pool = MambaPool(4)
    slot = int(pool.alloc(1)[0])

    def corrupt():
        pool._is_free[slot] = True  # marked free but not on the free list

    return pool.check_invariants, corrupt


def _radix_cache():
    from kvlab.mem_cache import RadixCache, TokenToKVPoolAllocator

    alloc = TokenToKVPoolAllocator(32)
    cache = RadixCache(token_to_kv_pool_allocator=alloc)
    cache.insert([1, 2, 3, 4], alloc.alloc(4))

    def corrupt():
        cache.evictable_size_ += 1

    return cache.check_invariants, corrupt


def _swa_radix_cache():
    from kvlab.mem_cache import SWARadixCache, SWATokenToKVPoolAllocator

    alloc = SWATokenToKVPoolAllocator(32, 16, page_size=1)
    cache = SWARadixCache(alloc, sliding_window_size=3)
    cache.insert([1, 2, 3, 4], alloc.alloc(4))

    def corrupt():
        cache.swa_evictable_size_ += 1

    return cache.check_invariants, corrupt


def _mamba_radix_cache():
    from kvlab.mem_cache import MambaPool, MambaRadixCache, TokenToKVPoolAllocator

    alloc = TokenToKVPoolAllocator(32)
    cache = MambaRadixCache(alloc, MambaPool(4))
    cache.insert([1, 2, 3, 4], alloc.alloc(4), int(cache.mamba_pool.alloc(1)[0]))
    leaf = next(n for n in cache.nodes() if n is not cache.root_node and not n.children)

    def corrupt():
        leaf.mamba_value = None

    return cache.check_invariants, corrupt


@dataclass(frozen=True)
class _Req:
    rid: str
    arrival_time_s: float
    prompt_token_ids: tuple
    output_len: int


def _scheduler():
    from kvlab.sched import SchedulerConfig
    from kvlab.sched.scheduler import Scheduler

    reqs = [_Req(f"r{i}", 0.0, (1, 2, 3, 4, 5 + i), 3) for i in range(4)]
    sched = Scheduler(SchedulerConfig(kv_tokens=128), reqs)
    sched.run(progress=False)

    def corrupt():
        sched.kv.allocator.alloc(1)  # a slot leaves the pool with no request or tree node holding it

    return sched.check_invariants, corrupt


CASES = {
    "CachingAllocatorModel": (_caching_allocator, "a segment's blocks tile it with no gap or overlap"),
    "CachingAllocatorModel.free": (_caching_allocator_free_path, "a tracked stat never goes negative"),
    "SimulatedGPU": (_simulated_gpu, "each pool stat's current value matches the blocks"),
    "TokenToKVPoolAllocator": (_token_allocator, "TokenToKVPoolAllocator: no page is on the free list twice"),
    "PagedTokenToKVPoolAllocator": (_paged_allocator, "pages are pending only inside an open free group"),
    "SWATokenToKVPoolAllocator": (_swa_allocator, "SWA allocator: only allocated full slots map to an SWA slot"),
    "ReqToTokenPool": (_req_to_token_pool, "ReqToTokenPool: no row is in free_slots twice"),
    "MHATokenToKVPool": (_kv_pool, "MHATokenToKVPool: one K and one V buffer per layer"),
    "MambaPool": (_mamba_pool, "MambaPool: the free list and the free mask agree"),
    "RadixCache": (_radix_cache, "RadixCache: counters evictable/protected match"),
    "SWARadixCache": (_swa_radix_cache, "SWARadixCache: swa counters match"),
    "MambaRadixCache": (_mamba_radix_cache, "MambaRadixCache: every leaf has a mamba state"),
    "Scheduler": (_scheduler, "no slot leak"),
}


def _run_case(build) -> dict:
    check, corrupt, *act = build()
    check()  # consistent before the corruption: the error below is the corruption's
    corrupt()
    try:
        (act[0] if act else check)()
    except Exception as err:  # report what was raised, whatever it was
        return {"raised": type(err).__name__, "is_invariant_error": isinstance(err, InvariantError),
                "invariant": getattr(err, "invariant", None), "values": repr(getattr(err, "values", None)),
                "message": str(err)}
    return {"raised": None}


def _child_main() -> None:
    asserts_stripped = True
    try:
        assert False  # noqa: B011 (the point: under -O this line is gone)
    except AssertionError:
        asserts_stripped = False
    report = {"optimize": sys.flags.optimize, "asserts_stripped": asserts_stripped,
              "cases": {name: _run_case(build) for name, (build, _) in CASES.items()}}
    print(json.dumps(report))


# ---- the tests (run by pytest) ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def optimized_report() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run([sys.executable, "-O", str(Path(__file__).resolve())], cwd=REPO_ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_child_really_runs_optimized(optimized_report):
    assert optimized_report["optimize"] == 1
    assert optimized_report["asserts_stripped"] is True


@pytest.mark.slow
@pytest.mark.parametrize("name", list(CASES))
def test_corruption_raises_invariant_error_under_O(optimized_report, name):
    outcome = optimized_report["cases"][name]
    assert outcome["raised"] == "InvariantError" and outcome["is_invariant_error"], outcome
    expected = CASES[name][1]
    assert expected in outcome["invariant"], outcome
    assert outcome["message"].startswith(f"invariant broken: {outcome['invariant']}")


def test_invariant_error_carries_the_rule_and_the_values():
    from kvlab.mem_cache import TokenToKVPoolAllocator

    a = TokenToKVPoolAllocator(8)
    a.alloc(2)
    a.free_pages = torch.cat([a.free_pages, a.free_pages[:2]])
    with pytest.raises(InvariantError) as info:
        a.check_invariants()
    err = info.value
    assert err.invariant == "TokenToKVPoolAllocator: no page is on the free list twice"
    assert err.values == {"listed": 8, "distinct": 6}
    assert isinstance(err, AssertionError)  # callers that caught the old asserts still catch it
    assert str(err) == f"invariant broken: {err.invariant} (listed=8, distinct=6)"


def test_invariant_error_on_the_allocator_model_names_the_stat():
    from kvlab.device.caching_allocator import CachingAllocatorModel

    a = CachingAllocatorModel(512 * MiB)
    a.malloc(5 * MiB)
    a._stats["allocated_bytes"]["large_pool"].current += 512
    with pytest.raises(AssertionError) as info:  # still an AssertionError, as tests written for asserts expect
        a.check_invariants()
    err = info.value
    assert isinstance(err, InvariantError)
    assert err.invariant == "each pool stat's current value matches the blocks"
    assert err.values == {"stat": "allocated_bytes.large_pool.current", "current": 5 * MiB + 512,
                          "blocks_say": 5 * MiB}


if __name__ == "__main__":
    _child_main()
