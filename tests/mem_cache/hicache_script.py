"""HiCache op scripts, two executors: kvlab's ``HiRadixCache`` in-process (here) and SGLang 0.5.16's own
``HiRadixCache`` in its reference venv (``tests/reference/sglang_hicache_driver.py``, class ``Runner``). Keep the
two op for op in step.

A scenario is ``{"size", "page_size", "policy", "write_policy", "host_ratio", "ops": [[name, *args], ...]}``:

| op | what both sides do | record fields |
| -- | -- | -- |
| ``serve tokens mode`` | match, lock the device prefix, evict (``mode``: the shortfall, or the whole need as 0.5.16), alloc the rest, insert, unlock | ``hit``, ``host_hit``, ``evicted``, ``ok``, ``prefix`` |
| ``match tokens`` | ``match_prefix`` | ``hit``, ``host_hit``, ``last_host`` (path of the best match node) |
| ``load_back tokens quota`` | match, then ``init_load_back`` from its best match node | ``loaded``, ``last`` |
| ``evict n`` / ``evict_host n`` | device / host eviction | ``evicted`` / ``host_evicted`` |
| ``sync`` | complete every copy in flight: SGLang ``writing_check`` + ``loading_check``; kvlab ``drain()`` | |
| ``lock tokens`` / ``unlock h`` | match + ``inc_lock_ref`` / ``dec_lock_ref`` of lock ``h`` | |
| ``hold n`` / ``release h`` | raw device ``alloc(n)`` held outside the tree / ``free`` it | ``ok`` |

Every record also has ``ev``, ``pr`` (device evictable / protected), ``dev_av``, ``host_av`` (free slots in each
pool) and ``tree``: every node as ``[path tokens, on device, on host, lock_ref]``, sorted. Copies are in flight
between ops on both sides (SGLang: until the next ``writing_check``; kvlab: until the clock reaches them), so a
node being written is locked on both sides alike.
"""

from __future__ import annotations

import random

import torch

from kvlab.mem_cache import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator
from kvlab.mem_cache.hicache.hiradix_cache import HiRadixCache
from kvlab.mem_cache.hicache.memory_pool_host import HostKVCache

WRITE_POLICIES = ("write_through", "write_through_selective", "write_back")
SIZE_PER_TOKEN = 128  # the driver's MHATokenToKVPool: 2 heads x 8 dims x 2 layers x 2 bytes x (K, V)


def path_of(node, root) -> list[int]:
    keys = []
    while node is not root:
        keys.append(list(node.key))
        node = node.parent
    return [t for k in reversed(keys) for t in k]


def residency(cache: HiRadixCache) -> list:
    return sorted([path_of(n, cache.root_node), n.value is not None, n.host_value is not None, n.lock_ref]
                  for n in cache.nodes() if n is not cache.root_node)


class KvlabHiRunner:
    """kvlab's executor. ``load_back_evict_mode="full"`` is 0.5.16's load-back eviction (what the driver runs);
    ``check`` runs every ``check_invariants()`` after every op."""

    def __init__(self, sc: dict, load_back_evict_mode: str = "full", check: bool = True, bandwidth: float = 1e6):
        self.ps = ps = sc["page_size"]
        size = sc["size"]
        self.alloc = TokenToKVPoolAllocator(size) if ps == 1 else PagedTokenToKVPoolAllocator(size, ps)
        self.host = HostKVCache(size, SIZE_PER_TOKEN, ps, hicache_ratio=sc["host_ratio"])
        self.cache = HiRadixCache(None, self.alloc, self.host, ps, write_policy=sc["write_policy"],
                                  eviction_policy=sc["policy"], load_back_evict_mode=load_back_evict_mode,
                                  d2h_bytes_per_s=bandwidth, h2d_bytes_per_s=bandwidth)
        self.check = check
        self.locks, self.held = [], []

    def run(self, op) -> dict:
        name, *args = op
        c, a = self.cache, self.alloc
        rec = {"op": name}
        if name == "serve":
            tokens, mode = args
            m = c.match_prefix(tokens)
            node, n = m.last_device_node, m.device_prefix_len
            rec["hit"], rec["host_hit"] = n, m.host_hit_length
            c.inc_lock_ref(node)
            need = len(tokens) // self.ps * self.ps - n
            avail = a.available_size()
            if avail < need:
                before = c.evictable_size()
                c.evict(need - avail if mode == "shortfall" else need)
                rec["evicted"] = before - c.evictable_size()
            new = a.alloc(need)
            rec["ok"] = new is not None
            if new is not None:
                prefix = c.insert(tokens, torch.cat([m.device_indices, new]))
                rec["prefix"] = prefix
                if prefix > n:
                    a.free(new[: prefix - n])
            c.dec_lock_ref(node)
        elif name == "match":
            m = c.match_prefix(args[0])
            rec["hit"], rec["host_hit"] = m.device_prefix_len, m.host_hit_length
            rec["last_host"] = path_of(m.last_host_node, c.root_node)
        elif name == "load_back":
            tokens, quota = args
            m = c.match_prefix(tokens)
            values, last = c.init_load_back(m.best_match_node, quota)
            rec["loaded"] = len(values)
            rec["last"] = path_of(last, c.root_node)
        elif name == "evict":
            before = c.evictable_size()
            c.evict(args[0])
            rec["evicted"] = before - c.evictable_size()
        elif name == "evict_host":
            rec["host_evicted"] = c.evict_host(args[0])
        elif name == "sync":
            c.drain()
        elif name == "lock":
            m = c.match_prefix(args[0])
            c.inc_lock_ref(m.last_device_node)
            self.locks.append(m.last_device_node)
        elif name == "unlock":
            node = self.locks[args[0]]
            if node is not None:
                c.dec_lock_ref(node)
                self.locks[args[0]] = None
        elif name == "hold":
            out = a.alloc(args[0])
            self.held.append(out)
            rec["ok"] = out is not None
        elif name == "release":
            if self.held[args[0]] is not None:
                a.free(self.held[args[0]])
                self.held[args[0]] = None
        else:
            raise ValueError(f"unknown hicache op {name!r}")
        rec["ev"], rec["pr"] = c.evictable_size(), c.protected_size()
        rec["dev_av"], rec["host_av"] = a.available_size(), self.host.available_size()
        rec["tree"] = residency(c)
        if self.check:
            c.check_invariants()
            a.check_invariants()
        return rec


def run_kvlab(scenarios: list[dict], load_back_evict_mode: str = "full", check: bool = True) -> list[list[dict]]:
    out = []
    for sc in scenarios:
        r = KvlabHiRunner(sc, load_back_evict_mode, check)
        out.append([r.run(op) for op in sc["ops"]])
    return out


def random_scenario(seed: int, page_size: int, policy: str, write_policy: str, n_ops: int = 80) -> dict:
    """Seeded random ops over sequences sharing prefixes, on a device pool small enough that device eviction,
    host eviction, load-backs over the threshold (10 tokens), failed allocations and copies in flight all
    happen."""
    rng = random.Random(seed)
    ps = page_size
    vocab = 5
    roots = [[rng.randrange(vocab) for _ in range(rng.randrange(max(3, 12 // ps), max(6, 32 // ps)) * ps)]
             for _ in range(4)]
    size = ps * rng.randrange(max(10, 36 // ps), max(14, 56 // ps))
    host_ratio = rng.choice([0.5, 1.0, 2.0, 4.0])

    def seq():
        base = rng.choice(roots)
        cut = rng.randrange(0, len(base) + 1)
        return base[:cut] + [rng.randrange(vocab) for _ in range(rng.randrange(1, 3 * ps + 6))]

    ops, unlocked, held, served = [], [], [], []
    locks = 0
    for _ in range(n_ops):
        kind = rng.choices(["serve", "match", "load_back", "evict", "evict_host", "sync", "lock", "unlock", "hold",
                            "release"], weights=[10, 2, 6, 3, 1, 4, 1, 1, 2, 1])[0]
        if kind == "serve":
            served.append(seq() if not served or rng.random() < 0.7 else rng.choice(served))
            ops.append(["serve", served[-1], rng.choice(["shortfall", "full"])])
        elif kind == "match":
            ops.append(["match", seq()])
        elif kind == "load_back":
            tokens = rng.choice(served) if served and rng.random() < 0.8 else seq()  # earlier requests: often on host
            ops.append(["load_back", tokens, rng.choice([None, None, rng.randrange(0, size)])])
        elif kind == "evict":
            ops.append(["evict", rng.randrange(0, size)])
        elif kind == "evict_host":
            ops.append(["evict_host", rng.randrange(0, size // 2)])
        elif kind == "sync":
            ops.append(["sync"])
        elif kind == "lock":
            ops.append(["lock", seq()])
            unlocked.append(locks)
            locks += 1
        elif kind == "unlock" and unlocked:
            ops.append(["unlock", unlocked.pop(rng.randrange(len(unlocked)))])
        elif kind == "hold":
            ops.append(["hold", ps * rng.randrange(1, 4)])
            held.append(len(held))
        elif kind == "release" and held:
            ops.append(["release", held.pop(rng.randrange(len(held)))])
    return {"size": size, "page_size": ps, "policy": policy, "write_policy": write_policy, "host_ratio": host_ratio,
            "ops": ops}
