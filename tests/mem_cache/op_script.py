"""One operation script, two executors: kvlab in-process (here) and SGLang in its reference venv
(``tests/reference/sglang_driver.py``, class ``Runner``). Keep the two op for op in step.

A scenario is ``{"size", "page_size", "policy", "ops": [[name, *args], ...]}``. Ops:

| op | what both sides do | record fields |
| -- | -- | -- |
| ``match tokens`` | ``match_prefix`` | ``hit``, ``idx`` (matched slots) |
| ``lock tokens`` | match, ``inc_lock_ref`` on the last node (handle = lock count so far) | ``hit`` |
| ``unlock h`` | ``dec_lock_ref`` of lock ``h`` | |
| ``evict n`` | ``tree.evict(n)`` | ``evicted`` |
| ``evict_ftc n`` | ``evict_from_tree_cache(tree, n)`` | ``evicted`` |
| ``hold n`` / ``release h`` | raw ``alloc(n)`` held outside the tree / ``free`` it | ``ok``, ``idx`` |
| ``req_start rid tokens`` | match ``tokens[:-1]``, lock, evict for the tail (+ page_size when paged), alloc the tail (``alloc_extend`` when paged) | ``hit``, ``evicted``, ``ok``, ``idx`` |
| ``req_decode rid tok`` | evict for 1 token (page_size when paged), ``alloc(1)`` / ``alloc_decode`` | ``evicted``, ``ok``, ``idx`` |
| ``req_finish rid prio`` | insert the page-aligned tokens, free duplicates and the unaligned tail, unlock | ``hit`` (already cached) |
| ``req_abort rid`` | free the request's own slots, unlock (retraction: nothing inserted) | |

Every record also has ``ev``, ``pr``, ``av``, ``tot``: evictable, protected, available, total after
the op. ``evicted`` is measured as the drop in ``evictable_size()`` on both sides.
"""

from __future__ import annotations

import random

import torch

from kvlab.mem_cache import (
    PagedTokenToKVPoolAllocator,
    RadixCache,
    TokenToKVPoolAllocator,
    evict_from_tree_cache,
)
from kvlab.units import align_down, align_up

POLICIES = ("lru", "lfu", "fifo", "mru", "filo", "priority")


def _t(v: int) -> torch.Tensor:
    return torch.tensor([v], dtype=torch.int64)


class KvlabRunner:
    """kvlab's executor. ``mode`` is evict_from_tree_cache's: "shortfall" (vs SGLang 0.5.23) or
    "full" (vs 0.5.16). ``check`` runs every check_invariants() after every op."""

    def __init__(self, size, page_size, policy, mode="shortfall", record_indices=True, check=True):
        self.ps = page_size
        self.mode = mode
        if page_size == 1:
            self.alloc = TokenToKVPoolAllocator(size)
        else:
            self.alloc = PagedTokenToKVPoolAllocator(size, page_size)
        self.cache = RadixCache(token_to_kv_pool_allocator=self.alloc, page_size=page_size,
                                eviction_policy=policy)
        self.record_indices = record_indices
        self.check = check
        self.locks, self.held, self.reqs = [], [], {}

    def _evict_ftc(self, n: int) -> int:
        before = self.cache.evictable_size()
        evict_from_tree_cache(self.cache, n, mode=self.mode)
        return before - self.cache.evictable_size()

    def run(self, op):
        name, args = op[0], op[1:]
        rec = {"op": name}
        if name in ("req_decode", "req_finish", "req_abort") and args[0] not in self.reqs:
            name = "skip"  # its req_start failed to allocate
        c, a, ps = self.cache, self.alloc, self.ps
        if name == "match":
            m = c.match_prefix(args[0])
            rec["hit"] = m.device_prefix_len
            if self.record_indices:
                rec["idx"] = m.device_indices.tolist()
        elif name == "lock":
            m = c.match_prefix(args[0])
            c.inc_lock_ref(m.last_device_node)
            self.locks.append(m.last_device_node)
            rec["hit"] = m.device_prefix_len
        elif name == "unlock":
            c.dec_lock_ref(self.locks[args[0]])
        elif name == "evict":
            rec["evicted"] = c.evict(args[0]).evicted_tokens
        elif name == "evict_ftc":
            rec["evicted"] = self._evict_ftc(args[0])
        elif name == "hold":
            out = a.alloc(args[0])
            self.held.append(out)
            rec["ok"] = out is not None
            if self.record_indices and out is not None:
                rec["idx"] = out.tolist()
        elif name == "release":
            out = self.held[args[0]]
            if out is not None:
                a.free(out)
                self.held[args[0]] = None
        elif name == "req_start":
            rid, tokens = args
            m = c.match_prefix(tokens[:-1])
            n, node, prefix = m.device_prefix_len, m.last_device_node, m.device_indices
            c.inc_lock_ref(node)
            rec["hit"] = n
            need = len(tokens) - n
            rec["evicted"] = self._evict_ftc(need + (ps if ps > 1 else 0))
            if ps == 1:
                new = a.alloc(need)
            else:
                new = a.alloc_extend(_t(n), _t(n), _t(len(tokens)), _t(len(tokens)),
                                     _t(int(prefix[-1]) if n else -1), need)
            rec["ok"] = new is not None
            if new is None:
                c.dec_lock_ref(node)
            else:
                if self.record_indices:
                    rec["idx"] = new.tolist()
                self.reqs[rid] = {"tokens": list(tokens), "kv": torch.cat([prefix, new]),
                                  "protected": n, "node": node}
        elif name == "req_decode":
            rid, tok = args
            r = self.reqs[rid]
            rec["evicted"] = self._evict_ftc(1 if ps == 1 else ps)
            if ps == 1:
                new = a.alloc(1)
            else:
                seq = len(r["kv"]) + 1
                new = a.alloc_decode(_t(seq), _t(seq), _t(int(r["kv"][-1])))
            rec["ok"] = new is not None
            if new is not None:
                r["kv"] = torch.cat([r["kv"], new])
                r["tokens"].append(tok)
                if self.record_indices:
                    rec["idx"] = new.tolist()
        elif name == "req_finish":
            rid, priority = args
            r = self.reqs.pop(rid)
            key_len = align_down(len(r["tokens"]), ps)
            kv = r["kv"]
            done = c.insert(r["tokens"][:key_len], kv[:key_len], priority=priority)
            rec["hit"] = done
            a.free(kv[r["protected"] : done])
            a.free(kv[key_len:])
            c.dec_lock_ref(r["node"])
        elif name == "req_abort":
            r = self.reqs.pop(args[0])
            a.free(r["kv"][r["protected"] :])
            c.dec_lock_ref(r["node"])
        elif name != "skip":
            raise ValueError(f"unknown op {name!r}")
        rec.update(ev=c.evictable_size(), pr=c.protected_size(), av=a.available_size(), tot=c.total_size())
        if self.check:
            c.check_invariants()
            a.check_invariants()
            self.check_conservation()
        return rec

    def check_conservation(self) -> None:
        """free + cached + held-by-requests + held raw == capacity, in whole pages."""
        ps = self.ps
        held = sum(len(h) for h in self.held if h is not None)
        for r in self.reqs.values():
            # pages the request owns outright: from its protected prefix to its last token's page
            held += align_up(len(r["kv"]), ps) - r["protected"]
        total = self.alloc.available_size() + self.cache.total_size() + held
        assert total == self.alloc.size, (self.alloc.available_size(), self.cache.total_size(), held)


def run_kvlab(scenarios, mode, record_indices=True, check=True):
    out = []
    for sc in scenarios:
        r = KvlabRunner(sc["size"], sc["page_size"], sc["policy"], mode, record_indices, check)
        out.append([r.run(op) for op in sc["ops"]])
    return out


def random_scenario(seed: int, page_size: int, policy: str, n_ops: int = 120) -> dict:
    """Seeded random ops over sequences that share prefixes; the pool is small enough that
    eviction, failed allocations and locked prefixes all happen."""
    rng = random.Random(seed)
    ps = page_size
    vocab = 6  # few distinct tokens: many shared prefixes and splits
    roots = [[rng.randrange(vocab) for _ in range(rng.randrange(2, 5) * ps)] for _ in range(4)]
    size = ps * rng.randrange(12, 28)

    def seq():
        base = rng.choice(roots)
        cut = rng.randrange(0, len(base) + 1)
        return base[:cut] + [rng.randrange(vocab) for _ in range(rng.randrange(1, 3 * ps + 3))]

    ops, live, locks, held = [], [], 0, []
    unlocked = []
    next_rid = 0
    for _ in range(n_ops):
        kind = rng.choices(
            ["start", "decode", "finish", "abort", "match", "lock", "unlock", "evict", "ftc", "hold", "release"],
            weights=[6, 6, 5, 1, 3, 1, 1, 1, 2, 1, 1],
        )[0]
        if kind == "start" or (kind in ("decode", "finish", "abort") and not live):
            s = seq()
            if len(s) < 2:
                s = s + [0]
            ops.append(["req_start", next_rid, s])
            live.append(next_rid)  # the runner ignores ops on a request whose start failed: see below
            next_rid += 1
        elif kind == "decode":
            ops.append(["req_decode", rng.choice(live), rng.randrange(vocab)])
        elif kind == "finish":
            rid = live.pop(rng.randrange(len(live)))
            ops.append(["req_finish", rid, rng.randrange(3)])
        elif kind == "abort":
            ops.append(["req_abort", live.pop(rng.randrange(len(live)))])
        elif kind == "match":
            ops.append(["match", seq()])
        elif kind == "lock":
            ops.append(["lock", seq()])
            unlocked.append(locks)
            locks += 1
        elif kind == "unlock" and unlocked:
            ops.append(["unlock", unlocked.pop(rng.randrange(len(unlocked)))])
        elif kind == "evict":
            ops.append(["evict", rng.randrange(0, 3 * ps + 2)])
        elif kind == "ftc":
            ops.append(["evict_ftc", rng.randrange(0, size // 2)])
        elif kind == "hold":
            ops.append(["hold", ps * rng.randrange(1, 4)])
            held.append(len(held))
        elif kind == "release" and held:
            ops.append(["release", held.pop(rng.randrange(len(held)))])
    return {"size": size, "page_size": ps, "policy": policy, "ops": ops}
