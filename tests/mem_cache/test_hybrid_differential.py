"""Differential test: kvlab's SWARadixCache / MambaRadixCache against SGLang 0.5.16's own classes.

SGLang 0.5.16 is the last release with ``SWARadixCache`` and ``MambaRadixCache`` as classes
(0.5.19+ fold them into ``UnifiedRadixCache`` components), so only the 0.5.16 reference venv is
used. Both construct on CPU: the SWA allocator gets a buffer-less ``BaseSWAKVPool`` stand-in, the
Mamba tree a global ``ServerArgs`` stand-in (``mamba_cache_chunk_size``) and a list-backed state
allocator (see ``tests/reference/sglang_driver.py::HybridRunner``).

The same seeded op scripts (serve requests with shared prefixes under pool pressure, match, hold
locks across ops, direct evictions, allocator holds) run through kvlab in-process and through the
driver, and every per-op record must match: hit lengths, insert prefix lengths, allocation
success, full / SWA / mamba evictable and protected sizes, and both pools' free counts.
``evict`` ops compare pool state, not SGLang's ``num_tokens_evicted`` (which leaves out tombstone
ancestors deleted during its SWA pass; kvlab counts what was freed).

Page size 1 only: SGLang's MambaRadixCache v1 requires it, and 0.5.16's paged SWA path launches
Triton kernels that cannot run on CPU.
"""

from __future__ import annotations

import json
import random
import subprocess

import pytest
import torch

from kvlab.mem_cache import (
    MambaPool,
    MambaRadixCache,
    SWARadixCache,
    SWATokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
    ensure_mamba_capacity,
    evict_from_tree_cache,
)
from kvlab.mem_cache.evict_policy import EvictParams

from .test_differential_sglang import DRIVER, require_reference

pytestmark = pytest.mark.slow


def random_hybrid_scenario(seed: int, kind: str, n_ops: int = 120) -> dict:
    """Requests built from a few shared stems (so prefixes are shared and split), with locks held
    across ops and allocator holds that create pressure on both pools."""
    rng = random.Random(seed)
    stems = [[rng.randrange(50) for _ in range(rng.randint(3, 10))] for _ in range(4)]
    history: list[list[int]] = []
    ops: list[list] = []
    n_locks = n_holds = 0
    for _ in range(n_ops):
        r = rng.random()
        if r < 0.5 or not history:
            if history and rng.random() < 0.5:
                base = list(rng.choice(history))[: rng.randint(1, 12)]
            else:
                base = list(rng.choice(stems))
            seq = base + [rng.randrange(50) for _ in range(rng.randint(1, 8))]
            history.append(seq)
            ops.append(["serve", seq])
        elif r < 0.6:
            ops.append(["match", list(rng.choice(history))[: rng.randint(1, 16)]])
        elif r < 0.7:
            ops.append(["lock", list(rng.choice(history))])
            n_locks += 1
        elif r < 0.78 and n_locks:
            ops.append(["unlock", rng.randrange(n_locks)])
        elif r < 0.88:
            ops.append(["evict", rng.choice([0, 0, 3, 8]), rng.choice([0, 2, 5, 12]) if kind == "swa" else rng.choice([0, 1, 2])])
        elif r < 0.95:
            ops.append(["hold", rng.randint(4, 20)])
            n_holds += 1
        elif n_holds:
            ops.append(["release", rng.randrange(n_holds)])
    ops += [["unlock", i] for i in range(n_locks)]
    sc = {"kind": kind, "size": 96, "ops": ops}
    if kind == "swa":
        sc.update(swa_size=48, window=rng.choice([2, 4, 8]))
    else:
        sc.update(mamba_size=rng.choice([4, 8, 16]))
    return sc


class KvlabHybridRunner:
    """kvlab's side of ``sglang_driver.HybridRunner``, op for op."""

    def __init__(self, sc: dict, mode: str):
        self.kind, self.mode = sc["kind"], mode
        if self.kind == "swa":
            self.alloc = SWATokenToKVPoolAllocator(sc["size"], sc["swa_size"], page_size=1)
            self.cache = SWARadixCache(self.alloc, sliding_window_size=sc["window"])
        else:
            self.alloc = TokenToKVPoolAllocator(sc["size"])
            self.cache = MambaRadixCache(self.alloc, MambaPool(sc["mamba_size"]))
        self.locks: list = []
        self.held: list = []

    def _lock(self, node):
        return self.cache.inc_lock_ref(node)

    def _unlock(self, node, res):
        if self.kind == "swa":
            self.cache.dec_lock_ref(node, res)
        else:
            self.cache.dec_lock_ref(node)

    def run(self, op) -> dict:
        name, args = op[0], op[1:]
        rec: dict = {"op": name}
        c, a = self.cache, self.alloc
        if name == "match":
            rec["hit"] = c.match_prefix(args[0]).device_prefix_len
        elif name == "lock":
            m = c.match_prefix(args[0])
            self.locks.append((m.last_device_node, self._lock(m.last_device_node)))
            rec["hit"] = m.device_prefix_len
        elif name == "unlock":
            if self.locks[args[0]] is not None:
                self._unlock(*self.locks[args[0]])
                self.locks[args[0]] = None
        elif name == "evict":
            if self.kind == "swa":
                c.evict(EvictParams(num_tokens=args[0], swa_num_tokens=args[1]))
            else:
                c.evict(args[0], mamba_num=args[1])
            rec["sg_evicted"] = None
        elif name == "hold":
            out = a.alloc(args[0])
            self.held.append(out)
            rec["ok"] = out is not None
        elif name == "release":
            if self.held[args[0]] is not None:
                a.free(self.held[args[0]])
                self.held[args[0]] = None
        elif name == "serve":
            tokens = args[0]
            m = c.match_prefix(tokens[:-1])
            node, n = m.last_device_node, m.device_prefix_len
            lock = self._lock(node)
            rec["hit"] = n
            need = len(tokens) - n
            evict_from_tree_cache(c, need, self.mode)
            slot = None
            if self.kind == "mamba":
                ensure_mamba_capacity(c, 1)
            new = a.alloc(need)
            if self.kind == "mamba" and new is not None:
                slot = c.mamba_pool.alloc(1)
                if slot is None:
                    a.free(new)
                    new = None
            rec["ok"] = new is not None
            if new is not None:
                value = torch.cat([m.device_indices, new])
                if self.kind == "swa":
                    rec["prefix"] = c.insert(tokens, value, prev_prefix_len=n)
                else:
                    res = c.insert(tokens, value, int(slot[0]), prev_prefix_len=n)
                    if res.mamba_exist:
                        c.mamba_pool.free(slot)
                    rec["prefix"] = res.prefix_len
            self._unlock(node, lock)
        else:
            raise ValueError(f"unknown hybrid op {name!r}")
        c.check_invariants()
        a.check_invariants()
        rec["full_ev"], rec["full_pr"] = c.full_evictable_size(), c.full_protected_size()
        if self.kind == "swa":
            rec["swa_ev"], rec["swa_pr"] = c.swa_evictable_size(), c.swa_protected_size()
            rec["av"], rec["swa_av"] = a.full_available_size(), a.swa_available_size()
        else:
            c.mamba_pool.check_invariants()
            rec["m_ev"], rec["m_pr"] = c.mamba_evictable_size(), c.mamba_protected_size()
            rec["av"], rec["m_av"] = a.available_size(), c.mamba_pool.available_size()
        return rec


def run_kvlab_hybrid(sc: dict, mode: str) -> list[dict]:
    r = KvlabHybridRunner(sc, mode)
    return [r.run(op) for op in sc["ops"]]


SCENARIOS = [random_hybrid_scenario(100 * s + (kind == "mamba"), kind) for kind in ("swa", "mamba") for s in range(6)]


@pytest.fixture(scope="module")
def sglang_0516_records() -> list[list[dict]]:
    py = require_reference("0.5.16")
    out = subprocess.run([str(py), str(DRIVER), "--hybrid-ops"], input=json.dumps({"scenarios": SCENARIOS}),
                         capture_output=True, text=True, timeout=600)
    if out.returncode:
        raise AssertionError(f"sglang driver failed:\n{out.stderr[-4000:]}")
    return json.loads(out.stdout)["results"]


def _first_difference(ours: list[dict], theirs: list[dict], ops: list) -> str:
    for i, (a, b) in enumerate(zip(ours, theirs)):
        b = dict(b)
        if "sg_evicted" in b:
            b["sg_evicted"] = None
        if a != b:
            return f"op {i} {ops[i][:1]}...: kvlab {a} vs SGLang {b}"
    return "" if len(ours) == len(theirs) else f"{len(ours)} records vs {len(theirs)}"


@pytest.mark.parametrize("i", range(len(SCENARIOS)), ids=[f"{sc['kind']}-{i}" for i, sc in enumerate(SCENARIOS)])
def test_hybrid_tree_matches_sglang_0516(i, sglang_0516_records):
    """0.5.16's evict_from_tree_cache: the SWA arm evicts per-pool shortfalls, the Mamba tree goes
    through the standard arm, which in 0.5.16 asks for the whole need: kvlab's ``mode="full"``."""
    sc = SCENARIOS[i]
    ours = run_kvlab_hybrid(sc, "full")
    diff = _first_difference(ours, sglang_0516_records[i], sc["ops"])
    assert not diff, diff


def test_scenarios_exercise_tombstones_and_pressure():
    """The scripts must reach the interesting states, or the comparison proves little."""
    tomb = failed = lost_states = 0
    for sc in SCENARIOS:
        r = KvlabHybridRunner(sc, "full")
        for op in sc["ops"]:
            rec = r.run(op)
            failed += rec.get("ok") is False
            if sc["kind"] == "swa":
                tomb += sum(x.swa_tombstone for x in r.cache.nodes())
        if sc["kind"] == "mamba":
            lost_states += sum(x.mamba_value is None for x in r.cache.nodes() if x is not r.cache.root_node)
    assert tomb > 0 and failed > 0 and lost_states > 0
