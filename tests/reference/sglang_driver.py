"""Drive SGLang's own RadixCache + allocators from a JSON script (runs inside a reference venv).

This file is executed by ``.ref/sglang-<version>/bin/python`` (built by ``.ci/setup_reference.sh``),
never imported by kvlab: the reference venv has SGLang but not kvlab. kvlab's side of the same
script is ``tests/mem_cache/op_script.py``; the two must stay in step, op for op.

Modes (JSON on stdin, JSON on stdout):

``--check``
    import SGLang's mem_cache and print its version.
``--ops``
    ``{"scenarios": [{"size", "page_size", "policy", "ops": [[name, *args], ...]}],
    "record_indices": bool}`` -> one list of per-op records per scenario. Op names and record
    fields are documented in ``tests/mem_cache/op_script.py``.
``--bench-radix``
    ``{"seqs": [[tok, ...]], "page_size": int}``: time match_prefix + insert over the sequences
    (tree only, precomputed values: the workload of docs/semantics.md#cost-of-the-upstream-tree). Optional
    ``"impl": "unified"`` runs the same workload on ``UnifiedRadixCache`` (0.5.19+, SGLang's
    default tree) with ``"tree_core": "rust"`` (default; the wheel's compiled
    ``rust_tree_core/mem_cache`` extension) or ``"python"``; see ``bench_radix_unified``. If
    that tree cannot be built, the reply is ``{"version", "impl", "error": reason}``.
``--bench-evict``
    ``{"leaves": [[tok, ...]], "priorities": [int], "touch": [int], "reinsert": [int],
    "calls": int, "policies": [str]}``: per policy, insert ``leaves`` (with those priorities),
    match the ``touch`` ones again, re-insert the ``reinsert`` ones (hit counts), then time
    ``calls`` x ``evict(1)``; report the victims (first slot freed per evicted leaf).
``--hybrid-ops``
    SWARadixCache / MambaRadixCache op scripts (SGLang <= 0.5.16); see ``HybridRunner``.

Time: SGLang stamps nodes with ``time.monotonic()``. The driver swaps the radix module's ``time``
for a logical clock (one tick per call), as kvlab's ``LogicalClock`` does, so both sides see the
same recency order and eviction victims are reproducible.
"""

from __future__ import annotations

import argparse
import enum
import importlib.machinery
import itertools
import json
import sys
import time
import types
import warnings
from array import array


def _stub_torchvision() -> None:
    """sglang.srt.configs imports torchvision for vision configs; CPU torch has none that loads.

    transformers caches ``is_torchvision_available()``: compute the real answer (False) first so
    the stub does not send it down image paths. Why: docs/testing.md#differential-tests-against-sglang.
    """
    try:
        import torchvision  # noqa: F401

        return
    except Exception:
        pass
    import transformers.utils.import_utils as iu

    iu.is_torchvision_available()

    def make(name):
        mod = types.ModuleType(name)
        mod.__file__ = "<stub>"
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)

        def getattr_(attr):
            if attr.startswith("__"):
                raise AttributeError(attr)
            return type(attr, (), {"__init__": lambda self, *a, **k: None})

        mod.__getattr__ = getattr_
        sys.modules[name] = mod
        return mod

    tv = make("torchvision")
    tr = make("torchvision.transforms")
    fn = make("torchvision.transforms.functional")
    tv.io = make("torchvision.io")  # 0.5.16's utils/common.py imports torchvision.io.decode_jpeg

    class InterpolationMode(enum.Enum):
        NEAREST = "nearest"
        NEAREST_EXACT = "nearest-exact"
        BILINEAR = "bilinear"
        BICUBIC = "bicubic"
        BOX = "box"
        HAMMING = "hamming"
        LANCZOS = "lanczos"

    tr.InterpolationMode = fn.InterpolationMode = InterpolationMode
    tv.transforms, tr.functional = tr, fn


def _stub_image_processor_registry() -> None:
    """transformers 5.12 (pinned by sglang 0.5.16) makes AutoImageProcessor a torchvision-only
    placeholder, and 0.5.16's configs register image processors at import time. Registration is
    irrelevant to mem_cache: give it a stand-in whose register() does nothing. Runs after
    ``import sglang``, whose transformers patches replace the ``transformers`` module object."""
    mod = sys.modules["transformers"]
    try:
        mod.AutoImageProcessor.register  # noqa: B018
    except ImportError:

        class _ImageProcessorRegistry:
            @classmethod
            def register(cls, *args, **kwargs):
                return None

        mod.AutoImageProcessor = _ImageProcessorRegistry


warnings.filterwarnings("ignore")
_stub_torchvision()

import sglang  # noqa: E402
import torch  # noqa: E402

_stub_image_processor_registry()
from sglang.srt.mem_cache import radix_cache as _radix_module  # noqa: E402
from sglang.srt.mem_cache.allocator import (  # noqa: E402
    PagedTokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
)
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.common import evict_from_tree_cache  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

VERSION = getattr(sglang, "__version__", "?")


def install_logical_clock() -> None:
    counter = itertools.count(1)
    _radix_module.time = types.SimpleNamespace(
        monotonic=lambda: float(next(counter)), perf_counter=time.perf_counter
    )


def key_of(tokens) -> RadixKey:
    return RadixKey(token_ids=array("q", tokens))


def make_cache(size: int, page_size: int, policy: str, allocator=None):
    if allocator is None:
        if page_size == 1:
            allocator = TokenToKVPoolAllocator(
                size, dtype=torch.bfloat16, device="cpu", kvcache=None, need_sort=False
            )
        else:
            allocator = PagedTokenToKVPoolAllocator(
                size, page_size, torch.bfloat16, "cpu", kvcache=None, need_sort=False
            )
    params = CacheInitParams(
        disable=False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=allocator,
        page_size=page_size,
        eviction_policy=policy,
    )
    return allocator, RadixCache(params)


def match(cache, tokens):
    """(prefix_len, last_node, indices) for both the 0.5.16 and the 0.5.23 MatchResult."""
    m = cache.match_prefix(MatchPrefixParams(key=key_of(tokens)))
    if hasattr(m, "device_indices"):
        return len(m.device_indices), m.last_device_node, m.device_indices
    n = m.device_prefix_len
    return n, m.last_device_node, cache.path_device_indices(m.last_device_node)[:n]


def evict_ftc(cache, n: int) -> int:
    before = cache.evictable_size()
    evict_from_tree_cache(cache, n)
    return before - cache.evictable_size()


def align_up(n: int, a: int) -> int:
    return -(-n // a) * a


class Runner:
    def __init__(self, size, page_size, policy, record_indices):
        self.ps = page_size
        self.alloc, self.cache = make_cache(size, page_size, policy)
        # 0.5.23's paged allocator falls back to alloc_extend_naive / alloc_decode_naive where
        # Triton is unsupported (use_triton_kernels False on CPU); 0.5.16 launches the Triton
        # kernels unconditionally, which cannot run here. There the driver emulates the two calls
        # with alloc(), which takes the same pages in the same order.
        self.cpu_extend = getattr(self.alloc, "use_triton_kernels", True) is False
        self.record_indices = record_indices
        self.locks = []
        self.held = []
        self.reqs = {}

    def _alloc_extend(self, prefix, n_total):
        m, need = len(prefix), n_total - len(prefix)
        if self.cpu_extend:
            last = int(prefix[-1]) if m else -1
            t = lambda v: torch.tensor([v], dtype=torch.int64)  # noqa: E731
            return self.alloc.alloc_extend(t(m), t(m), t(n_total), t(n_total), t(last), need)
        out = self.alloc.alloc(align_up(n_total, self.ps) - m)  # m is page-aligned (a match)
        return None if out is None else out[:need]

    def _alloc_decode(self, kv):
        seq = len(kv) + 1
        if self.cpu_extend:
            t = lambda v: torch.tensor([v], dtype=torch.int64)  # noqa: E731
            return self.alloc.alloc_decode(t(seq), t(seq), t(int(kv[-1])))
        if seq % self.ps == 1:
            out = self.alloc.alloc(self.ps)
            return None if out is None else out[:1]
        return kv[-1:] + 1

    def run(self, op):
        name, args = op[0], op[1:]
        rec = {"op": name}
        if name in ("req_decode", "req_finish", "req_abort") and args[0] not in self.reqs:
            name = "skip"  # its req_start failed to allocate
        c, a, ps = self.cache, self.alloc, self.ps
        if name == "match":
            n, _, idx = match(c, args[0])
            rec["hit"] = n
            if self.record_indices:
                rec["idx"] = idx.tolist()
        elif name == "lock":
            n, node, _ = match(c, args[0])
            c.inc_lock_ref(node)
            self.locks.append(node)
            rec["hit"] = n
        elif name == "unlock":
            c.dec_lock_ref(self.locks[args[0]])
        elif name == "evict":
            rec["evicted"] = c.evict(EvictParams(num_tokens=args[0])).num_tokens_evicted
        elif name == "evict_ftc":
            rec["evicted"] = evict_ftc(c, args[0])
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
            n, node, prefix = match(c, tokens[:-1])
            c.inc_lock_ref(node)
            rec["hit"] = n
            need = len(tokens) - n
            rec["evicted"] = evict_ftc(c, need + (ps if ps > 1 else 0))
            new = a.alloc(need) if ps == 1 else self._alloc_extend(prefix, len(tokens))
            rec["ok"] = new is not None
            if new is None:
                c.dec_lock_ref(node)
            else:
                if self.record_indices:
                    rec["idx"] = new.tolist()
                self.reqs[rid] = {
                    "tokens": list(tokens),
                    "kv": torch.cat([prefix.to(torch.int64), new]),
                    "protected": n,
                    "node": node,
                }
        elif name == "req_decode":
            rid, tok = args
            r = self.reqs[rid]
            rec["evicted"] = evict_ftc(c, 1 if ps == 1 else ps)
            new = a.alloc(1) if ps == 1 else self._alloc_decode(r["kv"])
            rec["ok"] = new is not None
            if new is not None:
                r["kv"] = torch.cat([r["kv"], new])
                r["tokens"].append(tok)
                if self.record_indices:
                    rec["idx"] = new.tolist()
        elif name == "req_finish":
            rid, priority = args
            r = self.reqs.pop(rid)
            key_len = len(r["tokens"]) // ps * ps
            kv = r["kv"]
            res = c.insert(
                InsertParams(key=key_of(r["tokens"][:key_len]), value=kv[:key_len].clone(),
                             priority=priority)
            )
            rec["hit"] = res.prefix_len
            a.free(kv[r["protected"] : res.prefix_len])
            a.free(kv[key_len:])
            c.dec_lock_ref(r["node"])
        elif name == "req_abort":
            r = self.reqs.pop(args[0])
            a.free(r["kv"][r["protected"] :])
            c.dec_lock_ref(r["node"])
        elif name != "skip":
            raise ValueError(f"unknown op {name!r}")
        rec.update(
            ev=c.evictable_size(), pr=c.protected_size(), av=a.available_size(), tot=c.total_size()
        )
        return rec


def run_ops(spec):
    out = []
    for sc in spec["scenarios"]:
        install_logical_clock()
        r = Runner(sc["size"], sc["page_size"], sc["policy"], spec.get("record_indices", True))
        out.append([r.run(op) for op in sc["ops"]])
    return {"version": VERSION, "results": out}


class RecordingAllocator:
    """Stands in for the allocator in benchmarks: records what the tree frees, costs ~nothing."""

    device = "cpu"

    def __init__(self):
        self.freed = []

    def free(self, idx):
        self.freed.append(int(idx[0]))

    def free_segment(self, idx, *, start_pos=0):
        self.freed.append(int(idx[0]))

    def available_size(self):
        return 0


def bench_radix(spec):
    if spec.get("impl", "radix") == "unified":
        return bench_radix_unified(spec)
    install_logical_clock()
    ps = spec["page_size"]
    _, cache = make_cache(8, ps, "lru", allocator=RecordingAllocator())
    seqs = [array("q", s) for s in spec["seqs"]]
    total = sum(len(s) for s in seqs)
    vals = torch.arange(1, total + 1, dtype=torch.int64)
    hits, prefix_lens = [], []
    off = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for s in seqs:
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(token_ids=s)))
        hits.append(m.device_prefix_len if hasattr(m, "device_prefix_len") else len(m.device_indices))
        res = cache.insert(InsertParams(key=RadixKey(token_ids=s), value=vals[off : off + len(s)]))
        prefix_lens.append(res.prefix_len)
        off += len(s)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"version": VERSION, "seconds": dt, "cpu_s": cpu, "hits": hits, "prefix_lens": prefix_lens,
            "total_size": cache.total_size()}


def make_unified_cache(page_size: int, tree_core: str = "rust"):
    """A FULL-only ``UnifiedRadixCache`` on a ``RecordingAllocator``, its TreeCore forced to
    ``tree_core``. Raises ``RuntimeError(reason)`` when SGLang would fall back to the Python core
    (``tree_core_registry._rust_fallback_reason``: platform, torch range, no extension) or builds
    another core than asked. Its import chain (managers.schedule_batch -> entrypoints.openai)
    needs ``openai`` and ``partial_json_parser`` in the venv; the ImportError names what lacks."""
    from sglang.srt.mem_cache.unified_cache.component_type import ComponentType
    from sglang.srt.mem_cache.unified_cache.tree_core_registry import (
        _rust_fallback_reason,
        select_tree_core_backend,
    )
    from sglang.srt.mem_cache.unified_radix_cache import UnifiedRadixCache

    params = CacheInitParams(
        disable=False,
        req_to_token_pool=None,
        token_to_kv_pool_allocator=RecordingAllocator(),
        page_size=page_size,
        eviction_policy="lru",
        tree_components=(ComponentType.FULL,),
        tree_core_backend=tree_core,
    )
    if tree_core == "rust":
        reason = _rust_fallback_reason(params)
        if reason is not None:
            raise RuntimeError(f"SGLang falls back to the Python TreeCore: {reason}")
    if select_tree_core_backend(params) != tree_core:
        raise RuntimeError(f"tree_core_backend={tree_core!r} resolves to "
                           f"{select_tree_core_backend(params)!r}")
    cache = UnifiedRadixCache(params)
    want = {"rust": "RustUnifiedTreeCore", "python": "UnifiedTreeCore"}.get(tree_core)
    got = type(cache.tree_core).__name__
    if want is not None and got != want:
        raise RuntimeError(f"asked for the {tree_core} TreeCore, UnifiedRadixCache built {got}")
    return cache


def bench_radix_unified(spec):
    """``--bench-radix`` on UnifiedRadixCache: the same match_prefix + insert loop and fields.

    ``insert`` gets ``prev_prefix_len=len(key)``: UnifiedRadixCache frees the duplicate slots
    [prev_prefix_len, prefix_len) itself (RadixCache leaves that to the caller), and the values
    here are fake, so nothing is freed, as in the RadixCache loop. ``total_size()`` is a
    (full, swa) pair there; the full-token count is reported.
    """
    ps, core = spec["page_size"], spec.get("tree_core", "rust")
    base = {"version": VERSION, "impl": "unified", "tree_core": core}
    try:
        cache = make_unified_cache(ps, core)
    except Exception as e:  # reported, not raised: the benchmark prints the reason
        return {**base, "error": f"{type(e).__name__}: {e}"}
    seqs = [array("q", s) for s in spec["seqs"]]
    total = sum(len(s) for s in seqs)
    vals = torch.arange(1, total + 1, dtype=torch.int64)
    hits, prefix_lens = [], []
    off = 0
    t0, c0 = time.perf_counter(), time.process_time()
    for s in seqs:
        m = cache.match_prefix(MatchPrefixParams(key=RadixKey(token_ids=s)))
        hits.append(m.device_prefix_len)
        res = cache.insert(InsertParams(key=RadixKey(token_ids=s), value=vals[off : off + len(s)],
                                        prev_prefix_len=len(s)))
        prefix_lens.append(res.prefix_len)
        off += len(s)
    dt, cpu = time.perf_counter() - t0, time.process_time() - c0
    full, _ = cache.total_size()
    return {**base, "tree_core_class": type(cache.tree_core).__name__, "seconds": dt, "cpu_s": cpu,
            "hits": hits, "prefix_lens": prefix_lens, "total_size": full}


def bench_evict(spec):
    return {"version": VERSION, "results": {p: _bench_evict_one(spec, p) for p in spec["policies"]}}


def _bench_evict_one(spec, policy):
    install_logical_clock()
    rec = RecordingAllocator()
    _, cache = make_cache(8, 1, policy, allocator=rec)
    off = 1
    for s, prio in zip(spec["leaves"], spec["priorities"]):
        cache.insert(InsertParams(key=key_of(s), value=torch.arange(off, off + len(s)), priority=prio))
        off += len(s)
    for i in spec["touch"]:
        cache.match_prefix(MatchPrefixParams(key=key_of(spec["leaves"][i])))
    for i in spec["reinsert"]:
        s = spec["leaves"][i]
        cache.insert(InsertParams(key=key_of(s), value=torch.zeros(len(s), dtype=torch.int64)))
    n_leaves = len(cache.evictable_leaves)
    calls = spec["calls"]
    t0 = time.perf_counter()
    for _ in range(calls):
        cache.evict(EvictParams(num_tokens=1))
    dt = time.perf_counter() - t0
    return {"seconds": dt, "calls": calls, "evictable_leaves": n_leaves, "victims": rec.freed}


# -- hybrid trees (SWARadixCache / MambaRadixCache; SGLang <= 0.5.16 has them as classes) ---------
# ``--hybrid-ops``: {"scenarios": [{"kind": "swa"|"mamba", "size", "swa_size", "window",
# "mamba_size", "ops": [...]}]} -> per-op records. kvlab's side: tests/mem_cache/test_hybrid_differential.py.
# Ops: ["serve", tokens] (match tokens[:-1], lock, evict_from_tree_cache(need) [+ one mamba
# state], alloc, insert(prev_prefix_len=hit), unlock), ["match", tokens], ["lock", tokens],
# ["unlock", i], ["evict", full_tokens, swa_tokens_or_states], ["hold", n], ["release", i].


def _hybrid_classes():
    from sglang.srt.mem_cache.allocator.swa import SWATokenToKVPoolAllocator
    from sglang.srt.mem_cache.base_swa_memory_pool import BaseSWAKVPool
    from sglang.srt.mem_cache.mamba_radix_cache import MambaRadixCache
    from sglang.srt.mem_cache.swa_radix_cache import SWARadixCache

    class NoBufferSWAPool(BaseSWAKVPool):
        """SWATokenToKVPoolAllocator asserts a BaseSWAKVPool; the tree never touches KV buffers."""

        def __init__(self):
            self.full_kv_pool = self.swa_kv_pool = None

        def register_mapping(self, m):
            self.full_to_swa_index_mapping = m

        def translate_loc_from_full_to_swa(self, k):
            return self.full_to_swa_index_mapping[k]

    NoBufferSWAPool.__abstractmethods__ = frozenset()
    return SWATokenToKVPoolAllocator, NoBufferSWAPool, SWARadixCache, MambaRadixCache


class _StateSlots:
    """``req_to_token_pool.mamba_allocator`` stand-in: slots 0..n-1, popped from the front."""

    def __init__(self, n):
        self.free_slots = list(range(n))

    def alloc(self, k):
        if k > len(self.free_slots):
            return None
        out, self.free_slots = self.free_slots[:k], self.free_slots[k:]
        return torch.tensor(out, dtype=torch.int64)

    def free(self, idx):
        self.free_slots.extend(torch.as_tensor(idx).reshape(-1).tolist())

    def available_size(self):
        return len(self.free_slots)


class HybridRunner:
    def __init__(self, sc):
        SWAAlloc, Pool, SWACache, MambaCache = _hybrid_classes()
        self.kind = sc["kind"]
        if self.kind == "swa":
            self.alloc = SWAAlloc(sc["size"], sc["swa_size"], 1, torch.bfloat16, "cpu", Pool(), False)
            self.cache = SWACache(CacheInitParams(disable=False, req_to_token_pool=None,
                                                  token_to_kv_pool_allocator=self.alloc, page_size=1,
                                                  sliding_window_size=sc["window"]))
        else:
            from sglang.srt.runtime_context import get_context

            get_context().set_server_args(types.SimpleNamespace(mamba_cache_chunk_size=64))
            self.alloc = TokenToKVPoolAllocator(sc["size"], torch.bfloat16, "cpu", None, False)
            self.states = _StateSlots(sc["mamba_size"])
            rtp = types.SimpleNamespace(mamba_allocator=self.states, mamba_ckpt_pool=None)
            self.cache = MambaCache(CacheInitParams(disable=False, req_to_token_pool=rtp,
                                                    token_to_kv_pool_allocator=self.alloc, page_size=1))
        self.locks, self.held = [], []

    def _match(self, tokens):
        m = self.cache.match_prefix(MatchPrefixParams(key=key_of(tokens)))
        return len(m.device_indices), m.last_device_node, m.device_indices

    def _lock(self, node):
        return self.cache.inc_lock_ref(node)

    def _unlock(self, node, res):
        from sglang.srt.mem_cache.base_prefix_cache import DecLockRefParams

        if self.kind == "swa":
            self.cache.dec_lock_ref(node, DecLockRefParams(swa_uuid_for_lock=res.swa_uuid_for_lock))
        else:
            self.cache.dec_lock_ref(node)

    def run(self, op):
        name, args = op[0], op[1:]
        rec = {"op": name}
        c, a = self.cache, self.alloc
        if name == "match":
            rec["hit"] = self._match(args[0])[0]
        elif name == "lock":
            n, node, _ = self._match(args[0])
            self.locks.append((node, self._lock(node)))
            rec["hit"] = n
        elif name == "unlock":
            if self.locks[args[0]] is not None:
                self._unlock(*self.locks[args[0]])
                self.locks[args[0]] = None
        elif name == "evict":
            if self.kind == "swa":
                r = c.evict(EvictParams(num_tokens=args[0], swa_num_tokens=args[1]))
            else:
                r = c.evict(EvictParams(num_tokens=args[0], mamba_num=args[1]))
            rec["sg_evicted"] = r.num_tokens_evicted
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
            n, node, prefix = self._match(tokens[:-1])
            lock = self._lock(node)
            rec["hit"] = n
            need = len(tokens) - n
            evict_from_tree_cache(c, need)
            slot = None
            if self.kind == "mamba" and self.states.available_size() < 1:
                c.evict(EvictParams(num_tokens=0, mamba_num=1))  # ensure_mamba_capacity
            new = a.alloc(need)
            if self.kind == "mamba" and new is not None:
                slot = self.states.alloc(1)
                if slot is None:
                    a.free(new)
                    new = None
            rec["ok"] = new is not None
            if new is not None:
                value = torch.cat([prefix.to(torch.int64), new])
                if self.kind == "swa":
                    res = c.insert(InsertParams(key=key_of(tokens), value=value, prev_prefix_len=n))
                else:
                    res = c.insert(InsertParams(key=key_of(tokens), value=value, mamba_value=slot,
                                                prev_prefix_len=n))
                    if res.mamba_exist:
                        self.states.free(slot)
                rec["prefix"] = res.prefix_len
            self._unlock(node, lock)
        else:
            raise ValueError(f"unknown hybrid op {name!r}")
        rec["full_ev"], rec["full_pr"] = c.full_evictable_size(), c.full_protected_size()
        if self.kind == "swa":
            rec["swa_ev"], rec["swa_pr"] = c.swa_evictable_size(), c.swa_protected_size()
            rec["av"], rec["swa_av"] = a.full_available_size(), a.swa_available_size()
        else:
            rec["m_ev"], rec["m_pr"] = c.mamba_evictable_size(), c.mamba_protected_size()
            rec["av"], rec["m_av"] = a.available_size(), self.states.available_size()
        return rec


def run_hybrid_ops(spec):
    out = []
    for sc in spec["scenarios"]:
        r = HybridRunner(sc)
        out.append([r.run(op) for op in sc["ops"]])
    return {"version": VERSION, "results": out}


def main() -> None:
    ap = argparse.ArgumentParser()
    g = ap.add_mutually_exclusive_group(required=True)
    for flag in ("--check", "--ops", "--bench-radix", "--bench-evict", "--hybrid-ops"):
        g.add_argument(flag, action="store_true")
    a = ap.parse_args()
    if a.check:
        _, cache = make_cache(16, 1, "lru")
        cache.insert(InsertParams(key=key_of([1, 2, 3]), value=torch.tensor([1, 2, 3])))
        assert match(cache, [1, 2, 4])[0] == 2
        print(json.dumps({"version": VERSION, "ok": True}))
        return
    spec = json.load(sys.stdin)
    fn = (run_ops if a.ops else bench_radix if a.bench_radix else run_hybrid_ops if a.hybrid_ops
          else bench_evict)
    json.dump(fn(spec), sys.stdout)


if __name__ == "__main__":
    main()
