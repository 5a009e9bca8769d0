"""Drive SGLang 0.5.16's own ``HiRadixCache`` tree logic from a JSON op script (runs inside the reference venv).

Executed by ``$KVLAB_REF_DIR/sglang-0.5.16/bin/python``, never imported by kvlab; kvlab's side of the same scripts
is ``tests/mem_cache/hicache_script.py``, op for op. JSON on stdin::

    {"scenarios": [{"size", "page_size", "policy", "write_policy", "host_ratio", "ops": [[name, *args], ...]}]}

and one list of per-op records per scenario on stdout (``{"version", "results"}``). ``--check`` imports and
prints the version.

What is SGLang's and what is not:

- SGLang's own classes: ``HiRadixCache`` (every tree method the ops call: ``insert``, ``match_prefix``, ``evict``
  with ``_evict_write_through`` / ``_evict_write_back``, ``evict_host``, ``init_load_back`` / ``load_back``,
  ``writing_check``, ``loading_check``, ``inc_lock_ref`` / ``dec_lock_ref``), the device allocator
  (``TokenToKVPoolAllocator`` / ``PagedTokenToKVPoolAllocator``), the device KV pool ``MHATokenToKVPool`` on the
  CPU, and the host pool ``MHATokenToKVPoolHost`` (its sizing, ``alloc`` and ``free``).
- Not SGLang's: ``SyncCacheController`` stands in for ``managers/cache_controller.py::HiCacheController``. The real
  controller builds on the CPU, but its first copy fails: ``HiCacheController.start_writing`` ->
  ``MHATokenToKVPoolHost.backup_from_device_all_layer`` (``pool_host/mha.py``, line 397 in 0.5.16) calls
  ``transfer_kv_direct``, which the module imports only ``if _is_cuda or _is_hip`` (line 45), so on a CPU it
  raises ``NameError: name 'transfer_kv_direct' is not defined``. The stand-in keeps the controller's contract with
  the tree: ``write`` takes host slots from the real host pool (None when full) and queues an ack naming the node,
  ``load`` takes device slots from the real allocator (None when short) and queues an ack, ``evict_device`` /
  ``evict_host`` free into the real pools; every ack's events report done, so a copy completes at the tree's next
  ``writing_check`` / ``loading_check``, never at issue (the ``sync`` op calls both).
- ``HiRadixCache.__init__`` is bypassed (``object.__new__`` + the attributes it sets, then ``RadixCache.__init__``):
  it builds the real controller and reads ``torch.distributed`` groups. The host pool's free-memory check
  (``psutil.virtual_memory().available`` minus a 10 GiB reserve) is given an unlimited host so the result does not
  depend on this machine's free memory.
- Time: as in ``sglang_driver.py``, ``time.monotonic`` is a shared logical counter in both the radix and the
  hiradix module, so recency and victim order are reproducible.
"""

from __future__ import annotations

import itertools
import json
import sys
import threading
import time
import types
from array import array
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import sglang_driver  # noqa: E402  (stubs torchvision, imports sglang)
import torch  # noqa: E402
from sglang.srt.mem_cache import hiradix_cache as _hiradix_module  # noqa: E402
from sglang.srt.mem_cache import radix_cache as _radix_module  # noqa: E402
from sglang.srt.mem_cache.allocator import PagedTokenToKVPoolAllocator, TokenToKVPoolAllocator  # noqa: E402
from sglang.srt.mem_cache.base_prefix_cache import (  # noqa: E402
    EvictParams,
    InitLoadBackParams,
    InsertParams,
    MatchPrefixParams,
)
from sglang.srt.mem_cache.cache_init_params import CacheInitParams  # noqa: E402
from sglang.srt.mem_cache.hiradix_cache import HiRadixCache  # noqa: E402
from sglang.srt.mem_cache.memory_pool import MHATokenToKVPool  # noqa: E402
from sglang.srt.mem_cache.pool_host import base as _host_base  # noqa: E402
from sglang.srt.mem_cache.pool_host.mha import MHATokenToKVPoolHost  # noqa: E402
from sglang.srt.mem_cache.radix_cache import RadixCache, RadixKey  # noqa: E402

VERSION = sglang_driver.VERSION
HEAD_NUM, HEAD_DIM, LAYER_NUM = 2, 8, 2  # size_per_token = 2 * 8 * 2 layers * 2 bytes (bf16) * 2 (K and V) = 128


class _Done:
    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        return None


class _Ack:
    def __init__(self, node_id: int, num_tokens: int):
        self.node_ids = [node_id]
        self.num_tokens = num_tokens
        self.start_event = self.finish_event = _Done()
        self.timing_enabled = False


class SyncCacheController:
    """The tree-facing contract of ``HiCacheController`` over SGLang's real pools; see the module docstring."""

    def __init__(self, allocator, host_pool, write_policy: str):
        self.mem_pool_device_allocator = allocator
        self.mem_pool_host = host_pool
        self.write_policy = write_policy
        self.reset()

    def reset(self) -> None:
        self.ack_write_queue: list[_Ack] = []
        self.ack_load_queue: list[_Ack] = []

    def write(self, device_indices, priority=None, node_id=-1, **_extra):
        host_indices = self.mem_pool_host.alloc(len(device_indices))
        if host_indices is None:
            return None
        self.ack_write_queue.append(_Ack(node_id, len(device_indices)))
        return host_indices

    def load(self, host_indices, priority=None, node_id=-1, **_extra):
        device_indices = self.mem_pool_device_allocator.alloc(len(host_indices))
        if device_indices is None:
            return None
        self.ack_load_queue.append(_Ack(node_id, len(host_indices)))
        return device_indices

    def evict_device(self, device_indices) -> int:
        self.mem_pool_device_allocator.free(device_indices)
        return len(device_indices)

    def evict_host(self, host_indices, backup_only: bool = True) -> int:
        self.mem_pool_host.free(host_indices)
        return len(host_indices)


def install_logical_clock() -> None:
    counter = itertools.count(1)
    clock = types.SimpleNamespace(monotonic=lambda: float(next(counter)), perf_counter=time.perf_counter)
    _radix_module.time = clock
    _hiradix_module.time = clock


def make_hicache(size: int, page_size: int, policy: str, write_policy: str, host_ratio: float):
    _host_base.psutil = types.SimpleNamespace(virtual_memory=lambda: types.SimpleNamespace(available=1 << 50))
    kv = MHATokenToKVPool(size, page_size, torch.bfloat16, head_num=HEAD_NUM, head_dim=HEAD_DIM, layer_num=LAYER_NUM,
                          device="cpu", enable_memory_saver=False)
    if page_size == 1:
        alloc = TokenToKVPoolAllocator(size, dtype=torch.bfloat16, device="cpu", kvcache=kv, need_sort=False)
    else:
        alloc = PagedTokenToKVPoolAllocator(size, page_size, torch.bfloat16, "cpu", kvcache=kv, need_sort=False)
    host = MHATokenToKVPoolHost(kv, host_ratio, 0, page_size, "layer_first", pin_memory=False, device="cpu")
    c = object.__new__(HiRadixCache)
    # What HiRadixCache.__init__ sets before RadixCache.__init__ (single rank, no storage, no metrics).
    fields = dict(_enable_metrics_flag=False, page_size=page_size, kv_cache=kv, token_to_kv_pool_host=host,
                  tp_group=None, attn_cp_group=None, attn_tp_group=None, pp_group=None, tp_world_size=1, pp_rank=0,
                  pp_size=1, enable_storage=False, enable_storage_metrics=False, extra_metric_labels=None,
                  load_cache_event=threading.Event(), cache_controller=SyncCacheController(alloc, host, write_policy),
                  ongoing_write_through={}, ongoing_load_back={}, ongoing_prefetch={}, ongoing_backup={},
                  prefetch_loaded_tokens_by_reqid={}, work_list=[], load_back_threshold=10,
                  write_through_threshold=1 if write_policy == "write_through" else 2,
                  evictable_host_leaves=set(), hicache_storage_pass_prefix_keys=False)
    for k, v in fields.items():
        setattr(c, k, v)
    RadixCache.__init__(c, CacheInitParams(disable=False, req_to_token_pool=None, token_to_kv_pool_allocator=alloc,
                                           page_size=page_size, eviction_policy=policy))
    return alloc, host, c


def key_of(tokens) -> RadixKey:
    return RadixKey(token_ids=array("q", tokens))


def path_of(node, root) -> list[int]:
    keys = []
    while node is not root:
        keys.append(list(node.key.token_ids))
        node = node.parent
    return [t for k in reversed(keys) for t in k]


def residency(cache) -> list:
    """Every node as [path tokens, on device, on host, lock_ref], sorted by path."""
    out, stack = [], [cache.root_node]
    while stack:
        node = stack.pop()
        stack.extend(node.children.values())
        if node is not cache.root_node:
            out.append([path_of(node, cache.root_node), node.value is not None, node.host_value is not None,
                        node.lock_ref])
    return sorted(out)


class Runner:
    def __init__(self, sc: dict):
        self.ps = sc["page_size"]
        self.alloc, self.host, self.cache = make_hicache(sc["size"], self.ps, sc["policy"], sc["write_policy"],
                                                         sc["host_ratio"])
        self.locks = []  # node per lock op (None once released)
        self.held = []

    def run(self, op) -> dict:
        name, *args = op
        c, a = self.cache, self.alloc
        rec = {"op": name}
        if name == "serve":  # match, lock, evict the shortfall, alloc, insert, unlock (tokens, mode)
            tokens, mode = args
            m = c.match_prefix(MatchPrefixParams(key=key_of(tokens)))
            node = m.last_device_node
            n = len(m.device_indices)
            rec["hit"], rec["host_hit"] = n, m.host_hit_length
            c.inc_lock_ref(node)
            need = len(tokens) // self.ps * self.ps - n
            avail = a.available_size()
            if avail < need:
                before = c.evictable_size()
                c.evict(EvictParams(num_tokens=need - avail if mode == "shortfall" else need))
                rec["evicted"] = before - c.evictable_size()
            new = a.alloc(need)
            rec["ok"] = new is not None
            if new is not None:
                res = c.insert(InsertParams(key=key_of(tokens), value=torch.cat([m.device_indices.to(torch.int64), new])))
                rec["prefix"] = res.prefix_len
                if res.prefix_len > n:
                    a.free(new[: res.prefix_len - n])
            c.dec_lock_ref(node)
        elif name == "match":
            m = c.match_prefix(MatchPrefixParams(key=key_of(args[0])))
            rec["hit"], rec["host_hit"] = len(m.device_indices), m.host_hit_length
            rec["last_host"] = path_of(m.last_host_node, c.root_node)
        elif name == "load_back":  # match, then init_load_back from the best match node
            tokens, quota = args
            m = c.match_prefix(MatchPrefixParams(key=key_of(tokens)))
            values, last = c.init_load_back(InitLoadBackParams(best_match_node=m.best_match_node,
                                                               host_hit_length=m.host_hit_length, mem_quota=quota))
            rec["loaded"] = len(values)
            rec["last"] = path_of(last, c.root_node)
        elif name == "evict":
            before = c.evictable_size()
            c.evict(EvictParams(num_tokens=args[0]))
            rec["evicted"] = before - c.evictable_size()
        elif name == "evict_host":
            before = self.host.available_size()
            c.evict_host(args[0])  # returns None in 0.5.16: measure the host slots it freed
            rec["host_evicted"] = self.host.available_size() - before
        elif name == "sync":
            c.writing_check()
            c.loading_check()
        elif name == "lock":
            m = c.match_prefix(MatchPrefixParams(key=key_of(args[0])))
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
        return rec


def run(spec: dict) -> dict:
    out = []
    for sc in spec["scenarios"]:
        install_logical_clock()
        r = Runner(sc)
        out.append([r.run(op) for op in sc["ops"]])
    return {"version": VERSION, "results": out}


def main() -> None:
    if "--check" in sys.argv:
        _, host, c = make_hicache(16, 1, "lru", "write_through", 2.0)
        print(json.dumps({"version": VERSION, "ok": True, "host_size": host.size}))
        return
    json.dump(run(json.load(sys.stdin)), sys.stdout)


if __name__ == "__main__":
    main()
