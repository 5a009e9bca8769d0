"""The scheduler's memory at page granularity: the fast engine's :class:`PageKV`, the same flows as
:class:`~kvlab.sched.kv.SchedulerKV` (match, extend and decode allocation, caching into the tree, eviction in the
run's mode) with no token ids, no slot ids and no tensors.

At page size P > 1 every decision of SGLang's scheduler and radix cache reads counts of tokens and pages and
compares whole pages, never a slot id. So:

- a request's tokens are its *page keys* (:class:`~kvlab.mem_cache.page_tree.PageKeys`: one id per whole page of
  prompt + planned outputs, computed once; a prompt's partly filled last page never enters the tree);
- the tree is a :class:`~kvlab.mem_cache.page_tree.PageRadixTree` over those keys (SGLang's paged radix cache
  with each page as one symbol);
- the allocator is :class:`PageCounter`, the free pages as a number (SGLang's paged allocator fails exactly
  when the pages asked for outnumber the free ones, staged frees included);
- a request holds ``ceil(kv_len / P)`` pages, of which the first ``cache_protected_len / P`` are the tree's.

Sizes reach the scheduler in tokens, as :class:`SchedulerKV` gives them. The engine is chosen by
:class:`~kvlab.sched.scheduler.Scheduler` for the fast path at page size > 1, with or without HiCache; the reference
loop (``fast_decode=False``) keeps the token-level memory, and the tests compare the two row by row and tree by tree.
With a host tier the tree is a :class:`~kvlab.mem_cache.hicache.page_hiradix.PageHiRadixTree` (``HiRadixCache`` op
for op over page ids, its host pool a count of pages, its copies on ``HiCacheController``'s clock): a match reports
the host hit, admission loads it back (:meth:`PageKV.load_back`), inserts count hits and back up.
"""

from __future__ import annotations

from collections.abc import Sequence

from kvlab.errors import require
from kvlab.mem_cache.page_tree import PageKeys, PageRadixTree
from kvlab.mem_cache.shortfall import shortfall_tokens, tokens_to_evict
from kvlab.sched.config import MAX_POOL_TOKENS, SchedulerConfig
from kvlab.sched.ledger import Ledger, PoolSizes
from kvlab.sched.memory import AllocationError, RowsExhaustedError
from kvlab.sched.request import HostTierState, MatchMemo, PageState, SimReq
from kvlab.sched.storage_tier import prefetch_done, start_prefetch, storage_options, storage_store


class PageCounter:
    """The paged allocator as counts: ``free`` pages of ``pages`` (page 0, SGLang's padding page, is not counted)."""

    def __init__(self, pages: int, page_size: int) -> None:
        self.pages = self.free = pages
        self.page_size = page_size

    def available_size(self) -> int:
        """Free tokens (SGLang: ``(len(free_pages) + len(release_pages)) * page_size``)."""
        return self.free * self.page_size

    def free_list_pages(self) -> int:
        return self.free

    def take(self, pages: int) -> bool:
        """Hand out ``pages``; False (and nothing taken) when fewer are free."""
        if pages > self.free:
            return False
        self.free -= pages
        return True

    def check_invariants(self) -> None:
        require(0 <= self.free <= self.pages, "PageCounter: 0 <= free pages <= pool pages", free=self.free,
                pages=self.pages)


class PageKV:
    """Pools and tree of one run at page granularity (:class:`SchedulerKV`'s interface; with HiCache, a
    :class:`~kvlab.mem_cache.hicache.page_hiradix.PageHiRadixTree` over a host pool of pages)."""

    def __init__(self, config: SchedulerConfig, ledger: Ledger, storage=None) -> None:
        ps = self.page_size = config.page_size
        require(ps > 1, "PageKV: page size > 1", page_size=ps)
        self.kv_tokens = config.kv_tokens
        self.eviction = config.eviction  # finding 2's mode: "shortfall" (the fix) or "full" (the bug)
        self.ledger = ledger
        self.allocator = PageCounter(config.kv_tokens // ps, ps)
        self.hicache = config.hicache
        if self.hicache:
            from kvlab.mem_cache.hicache.page_hiradix import PageHiRadixTree
            from kvlab.mem_cache.hicache.page_host import PageHostPool

            cost = config.cost
            host = PageHostPool(config.kv_tokens, cost.kv_bytes_per_token, ps, config.hicache_ratio or 2.0,
                                config.hicache_size_gb)
            self.tree = PageHiRadixTree(self.allocator, host, config.hicache_write_policy, config.policy,
                                        config.eviction, cost.device_to_host_bytes_per_s,
                                        cost.host_to_device_bytes_per_s)
        else:
            self.tree = PageRadixTree(config.policy)
        self.keys = PageKeys(ps)
        if config.hicache_storage:  # the storage tier (L3): page keys hashed per page, from the run's PageKeys
            self.storage = storage_store(config, storage)
            self.tree.attach_page_storage(self.keys, self.storage, **storage_options(config))
        self._rows = list(range(config.max_running + 1, 0, -1))  # free request rows (ReqToTokenPool's count)

    def prepare(self, requests: Sequence[SimReq]) -> None:
        """Before the run: each request emits placeholders (zeros) instead of its planned tokens, which move to
        its :class:`~kvlab.sched.request.PageState`. Nothing here reads an output token but a page key reaching into the outputs, which
        reads only that page's tokens (a trace's random outputs are drawn that far, not all 4 million)."""
        longest = max((r.max_new_tokens for r in requests), default=0)
        zeros = bytes(longest)  # indexing and slicing give zeros, at C speed, and one byte per token
        for req in requests:
            req.page, req.planned_output = PageState(req.planned_output), zeros

    # ---- sizes (tokens) -------------------------------------------------------------------------
    def available(self) -> int:
        return self.allocator.free * self.page_size

    def evictable(self) -> int:
        return self.tree.evictable_size_ * self.page_size

    def sizes(self) -> PoolSizes:
        tree, ps = self.tree, self.page_size
        return PoolSizes(self.allocator.free * ps, tree.evictable_size_ * ps, tree.protected_size_ * ps)

    def state(self) -> tuple:
        tree = self.tree
        return self.allocator.free, tree.evictable_size_, tree.protected_size_, tree.structure_version

    # ---- eviction -------------------------------------------------------------------------------
    def evict(self, tokens: int) -> None:
        """``evict_from_tree_cache(tree, tokens, mode)`` in pages, noted in the ledger in tokens."""
        ps = self.page_size
        available = self.allocator.free * ps
        if tokens <= available:  # (most calls: nothing is missing, and the rule asks for nothing; not called)
            return
        requested = tokens_to_evict(tokens, available, self.eviction)
        if not requested:
            return
        shortfall = shortfall_tokens(tokens, available)
        pages = self.tree.evict(-(-requested // ps))
        if not self.hicache:  # (the two-tier tree frees through its controller, a write-back once its copy landed)
            self.allocator.free += pages  # (the tree's evict frees its leaves' pages)
        self.ledger.note_evicted(shortfall, requested, pages * ps)

    def reserve(self, tokens: int) -> bool:
        self.evict(tokens)
        return self.allocator.free * self.page_size >= tokens

    # ---- keys -----------------------------------------------------------------------------------
    def page_keys(self, req: SimReq, pages: int):
        """The ids of the first ``pages`` whole pages of the request's prompt + planned outputs."""
        state = req.page
        keys = state.keys
        if keys is None:
            keys = state.keys = self.keys.of_sequence(req.prompt, len(req.prompt) // self.page_size)
        if len(keys) < pages:  # pages reaching into the outputs (a finished or re-admitted request)
            ps, prompt, out = self.page_size, req.prompt, state.output_tokens
            n = len(prompt)
            for p in range(len(keys), pages):
                a, b = p * ps, p * ps + ps
                head = PageKeys.span(prompt, a, b) if a < n else []
                keys.append(self.keys.of_tokens(head + list(out[max(a, n) - n : b - n])))
        return keys

    # ---- prefill --------------------------------------------------------------------------------
    def match(self, req: SimReq) -> None:
        """``SchedulerKV.match`` in pages: the input capped one token short, whole pages; a repeated match with the
        tree's structure unchanged, or changed away from its walk (:meth:`_current_memo`), is replayed
        (``restamp_path``)."""
        fill_len = len(req.prompt) + len(req.output_ids)
        tree, ps = self.tree, self.page_size
        memo = req.match_memo
        if self.hicache:
            return self._match_two_tiers(req, fill_len, memo)
        if memo is not None and memo.fill_len == fill_len and (  # (a stale memo made current, or walked again)
                memo.version == tree.structure_version or (memo := self._current_memo(req, memo)) is not None):
            tree.restamp_path(memo.last_node)
            req.last_node = memo.last_node
            req.prefix_len = req.cache_protected_len = req.kv_len = memo.prefix_len
            return
        req.fill_ids = range(fill_len)  # no tokens here: the scheduler reads only its length
        cap = (fill_len - 1) // ps
        node, pages = tree.match_prefix(self.page_keys(req, cap), cap)
        req.last_node = node
        req.prefix_len = req.cache_protected_len = req.kv_len = pages * ps
        if cap:
            req.match_memo = MatchMemo(tree.structure_version, fill_len, None, node, pages * ps)

    def _match_two_tiers(self, req: SimReq, fill_len: int, memo: MatchMemo | None) -> None:
        """``SchedulerKV.match`` with a host tier: the device prefix, and the host hit below it with the node a
        load-back ends at (``req.host``); a repeated match with the structure unchanged, or changed away from its
        walk (:meth:`_current_memo`), is replayed (a clock read per node, ``restamp_path``; the tiers' ends,
        ``match_ends``)."""
        tree, ps = self.tree, self.page_size
        host = req.host
        if host is None:
            host = req.host = HostTierState()
        if memo is not None and memo.fill_len == fill_len and (  # (a stale memo made current, or walked again)
                memo.version == tree.structure_version or (memo := self._current_memo(req, memo)) is not None):
            tree.restamp_path(memo.last_node)
            req.last_node, host.best_match_node, hit = memo.ends
            host.hit_len = hit * ps
            req.prefix_len = req.cache_protected_len = req.kv_len = memo.prefix_len
            return
        req.fill_ids = range(fill_len)
        cap = (fill_len - 1) // ps
        if not cap:
            req.last_node = host.best_match_node = tree.root_node
            host.hit_len = req.prefix_len = req.cache_protected_len = req.kv_len = 0
            return
        end, pages = tree.match_walk(self.page_keys(req, cap), cap)
        ends = req.last_node, host.best_match_node, hit = tree.match_ends(end)
        host.hit_len = hit * ps
        req.prefix_len = req.cache_protected_len = req.kv_len = (pages - hit) * ps
        req.match_memo = MatchMemo(tree.structure_version, fill_len, None, end, (pages - hit) * ps, ends)

    def _current_memo(self, req: SimReq, memo: MatchMemo) -> MatchMemo | None:
        """A stale memo (the tree's structure changed since its walk) made current, or None when the walk must be
        made again. The walk would end at the same node (``memo.last_node``) when that node is still in the tree
        (it and each node above it filed under its parent by its first page: none of them deleted; a split above it
        lengthens its path but spells the same pages, and the walk would take both halves whole) and no child of it
        starts with the next page (a node inserted there would lengthen the match, or be split by it); its side
        effects are then those of a replay (``restamp_path`` over the path as it is now). A two-tier memo's ends
        are read again (``match_ends``): a node of the path may have moved tier since."""
        tree, ps, end = self.tree, self.page_size, memo.last_node
        pages = memo.prefix_len // ps + (memo.ends[2] if memo.ends else 0)  # (device pages, then host-only ones)
        cap = (memo.fill_len - 1) // ps
        if pages < cap and self.page_keys(req, cap)[pages] in end.children:
            return None
        node, root = end, tree.root_node
        while node is not root:
            parent = node.parent
            if parent is None or parent.children.get(node.key[0]) is not node:
                return None
            node = parent
        if memo.ends is None:
            memo = MatchMemo(tree.structure_version, memo.fill_len, None, end, memo.prefix_len)
        else:
            ends = tree.match_ends(end)
            memo = MatchMemo(tree.structure_version, memo.fill_len, None, end, (pages - ends[2]) * ps, ends)
        req.match_memo = memo
        return memo

    def load_back(self, req: SimReq) -> int:
        """``SchedulerKV.load_back`` in pages: the request's host-only match back on the device (its device prefix
        locked meanwhile), the load's eviction noted; returns the tokens loaded (0: skipped or no room)."""
        host = req.host
        if host is None or not host.hit_len:
            return 0
        tree = self.tree
        tree.inc_lock_ref(req.last_node)
        pages, ev = tree.load_back(host.best_match_node)
        tree.dec_lock_ref(req.last_node)
        if ev is not None:
            self.ledger.note_evicted(*ev)
        host.hit_len = 0
        if not pages:
            return 0
        loaded = pages * self.page_size
        req.last_node = host.best_match_node
        req.prefix_len = req.cache_protected_len = req.kv_len = req.prefix_len + loaded
        host.loaded_len += loaded
        return loaded

    # ---- the storage tier (L3) -----------------------------------------------------------------
    def prefetch(self, req: SimReq) -> None:
        """``SchedulerKV.prefetch`` in pages: match, and prefetch the prompt's whole pages past the host match
        from storage, up to the input − 1 cap."""
        self.match(req)
        host = req.host
        last_host = host.best_match_node
        if last_host.host_value is not None:  # backed up, or the root
            tree, ps = self.tree, self.page_size
            cap = (len(req.fill_ids) - 1) // ps  # (the input the match just capped: its fill_ids)
            matched = (req.prefix_len + host.hit_len) // ps
            keys = self.page_keys(req, cap)[matched:cap] if cap > matched else []
            start_prefetch(tree, req, last_host, keys)

    def prefetch_done(self, req: SimReq) -> bool:
        """Before admission: may the request be scheduled now (:func:`kvlab.sched.storage_tier.prefetch_done`)?"""
        return prefetch_done(self.tree, req)

    def replayable(self, req: SimReq) -> bool:
        memo = req.match_memo
        return memo is not None and memo.version == self.tree.structure_version

    def replay_matches_of(self, req: SimReq, times: int) -> None:
        if times:
            tree = self.tree
            if self.hicache:
                tree.restamp_path(req.match_memo.last_node, times)
                return
            tree.clock.now += times - 1
            tree.restamp_path(req.match_memo.last_node)

    def lock(self, req: SimReq) -> None:
        self.tree.inc_lock_ref(req.last_node)

    def unlock(self, req: SimReq) -> None:
        self.tree.dec_lock_ref(req.last_node)

    def alloc_extend(self, batch: Sequence[SimReq]) -> None:
        """A row per new request, then the pages for every ``extend_len`` (SGLang's eviction first: the extend plus
        a page per request)."""
        ps, rows = self.page_size, self._rows
        new = [r for r in batch if r.req_pool_idx is None]
        if len(new) > len(rows):
            raise RowsExhaustedError("request rows exhausted (max_running too small for the batch)")
        for req in new:
            req.req_pool_idx = rows.pop()
        extend = pages = 0
        for r in batch:
            extend += r.extend_len
            pages += -(-(r.kv_len + r.extend_len) // ps) - -(-r.kv_len // ps)
        self.evict(extend + len(batch) * ps)
        if not self.allocator.take(pages):
            raise AllocationError(f"Prefill out of memory: {extend} tokens wanted, {self.available()} available, "
                               f"{self.evictable()} evictable")

    def _cache(self, req: SimReq, tokens: int, chunked: bool) -> None:
        """``cache_unfinished_req`` of the request's first ``tokens``: insert the whole pages, free the duplicates,
        move the lock to the node ending them (re-matched: ``restamp_path``)."""
        tree, ps = self.tree, self.page_size
        n = tokens // ps
        protected = req.cache_protected_len // ps
        if self.hicache:  # (chunked: no hit counted; the re-match reads the clock per node)
            done, last = tree.insert(self.page_keys(req, n), n, 0, chunked, req.last_node, protected)
        else:
            done, last = tree.insert(self.page_keys(req, n), n, 0, n if chunked else 0, req.last_node, protected)
        if done > protected:
            self.allocator.free += done - protected
        if n:
            tree.rematch(last) if self.hicache else tree.restamp_path(last)
        req.cache_protected_len = n * ps
        if req.last_node is not None:
            tree.dec_lock_ref(req.last_node)
        tree.inc_lock_ref(last)
        req.last_node = last

    def cache_chunk(self, req: SimReq) -> None:
        self._cache(req, req.kv_len, True)

    def cache_unfinished(self, req: SimReq) -> None:
        self._cache(req, len(req.fill_ids), False)

    # ---- decode ---------------------------------------------------------------------------------
    def alloc_decode(self, running: Sequence[SimReq]) -> None:
        """A page for each request whose last emitted token opens one (SGLang evicts for a page per request
        first); each request's ``kv_len`` becomes its ``seq_len``."""
        ps = self.page_size
        self.evict(len(running) * ps)
        need = sum(1 for r in running if r.seq_len % ps == 1)
        if not self.allocator.take(need):
            raise AllocationError(f"Decode out of memory: {len(running)} requests, {self.available()} slots available")
        for req in running:
            req.kv_len = req.seq_len

    def take_decode_pages(self, batch_size: int, num_pages: int) -> list[int]:
        if not self.allocator.take(num_pages):
            raise AllocationError(f"Decode out of memory: {batch_size} requests, {self.available()} slots available")
        return [0] * num_pages  # (no page ids: the event-driven rounds only count them)

    def last_slot(self, req: SimReq) -> int:
        return 0

    def write_decoded(self, req: SimReq, written_len: int, last_slot: int, opened_pages: list, end: int) -> int:
        return 0  # no rows to write

    # ---- leaving --------------------------------------------------------------------------------
    def _release(self, req: SimReq, insert: bool) -> None:
        """``cache_finished_req`` (all but the last output token: inserted whole pages when ``insert``) and the
        row freed: the request's own pages go back except those the tree took."""
        tree, ps = self.tree, self.page_size
        kv = max(0, len(req.prompt) + len(req.output_ids) - 1)
        n = kv // ps
        protected = req.cache_protected_len // ps
        own = -(-kv // ps) - protected  # the pages past the tree's part of its prefix
        if insert:  # the new leaf keeps [done, n); the duplicates [protected, done) and the tail go back
            done, _ = tree.insert(self.page_keys(req, n), n, 0, False if self.hicache else 0, req.last_node, protected)
            own -= n - max(done, protected)
        self.allocator.free += own
        if req.last_node is not None:
            tree.dec_lock_ref(req.last_node)
            req.last_node = None
        self._rows.append(req.req_pool_idx)
        req.req_pool_idx = None

    def finish(self, req: SimReq) -> None:
        self._release(req, True)
        req.fill_ids, req.output_ids = [], []
        req.match_memo = req.page.keys = None
        self.ledger.note_finished(req)

    def release_retracted(self, req: SimReq) -> None:
        self._release(req, False)
        req.kv_len = req.prefix_len = 0

    def release_aborted(self, req: SimReq) -> None:
        self._release(req, False)

    def check_invariants(self, holders: Sequence[SimReq]) -> None:
        """Tree and counter consistent, and every page accounted for once: free + cached + held by ``holders``
        (running and chunked requests: ``ceil(kv_len / P)`` pages each, less the tree's) == the pool."""
        self.allocator.check_invariants()
        self.tree.check_invariants()
        ps = self.page_size
        held = sum(-(-r.kv_len // ps) - r.cache_protected_len // ps for r in holders)
        require(self.allocator.free + self.tree.total_size() + held == self.allocator.pages,
                "no page leak: free + cached + held by requests == pool pages", free=self.allocator.free,
                cached=self.tree.total_size(), held=held, pages=self.allocator.pages)

    def result_tree(self):
        """The final tree as the token-level ``RadixCache`` (``HiRadixCache``) the reference run ends with. A pool
        beyond the token-level memory's bound (2^26 tokens, which only the page engine takes) is rebuilt as one just
        big enough for the tree: slot tables of 2^40 tokens would not fit."""
        kv = self.kv_tokens
        if kv > MAX_POOL_TOKENS:
            kv = (self.tree.total_size() + 1) * self.page_size
        if self.hicache:
            return self.tree.to_hiradix_cache(self.keys, kv)
        return self.tree.to_radix_cache(self.keys, kv)
