"""The two-tier tree's storage tier (L3): page keys on the nodes, backups of host copies to storage, and prefetches
of a request's prompt from storage into host before its admission.

Upstream: SGLang 0.5.16's ``mem_cache/hiradix_cache.py::HiRadixCache`` (the tree kvlab mirrors; 0.5.23 moved the
same flows into ``unified_radix_cache.py``): ``prefetch_from_storage``, ``can_terminate_prefetch`` with
``_prefetch_timeout_check_linear_func``, ``check_prefetch_progress``, ``_insert_helper_host``,
``pop_prefetch_loaded_tokens``, ``write_backup_storage`` (called from ``_finish_write_through_ack`` for every host
backup acknowledged, so under every write policy a page reaches storage when its host copy lands: at its first
insert under ``write_through``, its second hit under ``write_through_selective``, its device eviction under
``write_back``), ``_concat_split_chain`` (a node split while its host copy was in flight is backed up as the chain
it became), ``drain_storage_control_queues`` (backup acks release their nodes' host protection) and the node keys
``compute_node_hash_values`` / ``split_node_hash_value``. Prefetch policies (``--hicache-storage-prefetch-policy``):
``best_effort`` takes what has landed when the request is scheduled, ``wait_complete`` waits for every hit page,
``timeout`` waits at most ``min(max, base + per_ki_token * tokens / 1024)`` seconds from the prefetch's start.

Differs on purpose: when the tokens a prefetch read extend past a node with no host copy (a device node not yet
backed up), they are not inserted below it (SGLang would hang a host-only node there, breaking the write-through
prefix that kvlab's invariant checks): those tokens are freed and count as not prefetched. A mixin of both
two-tier trees: :class:`~kvlab.mem_cache.hicache.hiradix_cache.HiRadixCache` (keys of tokens, host slots as tensors)
and :class:`~kvlab.mem_cache.hicache.page_hiradix.PageHiRadixTree` (keys of page ids, ``key_tokens`` = the page
size: a page's storage key hashed from its id's tokens, memoised per page; host copies as ``True``, host slots as
``range`` counts).
"""

from __future__ import annotations

import math
from array import array

from kvlab.errors import require
from kvlab.mem_cache.base_prefix_cache import common_prefix_len
from kvlab.mem_cache.hicache.storage import PREFETCH_POLICIES, HiCacheStorage
from kvlab.mem_cache.hicache.storage_controller import PrefetchOperation, StorageController
from kvlab.mem_cache.hicache.tree_node import HiTreeNode
from kvlab.mem_cache.options import FINISH_TOLERANCE_S
from kvlab.units import align_down

PREFETCH_TIMEOUT_DEFAULTS = (2.0, 0.1, 30.0)  # PrefetchTimeoutConfig: base s, per_ki_token s, max s


class StorageMoves:
    """The storage-tier methods of :class:`~kvlab.mem_cache.hicache.hiradix_cache.HiRadixCache` (a mixin)."""

    __slots__ = ()  # (a mixin: the tree that uses it lists its fields, see PageHiRadixTree.__slots__)

    storage_controller: StorageController | None = None
    _storage_due_s = math.inf  # (no storage tier: no storage event is ever due)
    key_tokens = 1  # tokens per key element: 1 (the token tree), the page size (the page tree: page ids)

    def attach_storage(self, storage: HiCacheStorage, *, read_bytes_per_s: float, write_bytes_per_s: float,
                       latency_s: float, prefetch_policy: str = "best_effort", prefetch_threshold: int = 256,
                       prefetch_timeout: tuple[float, float, float] = PREFETCH_TIMEOUT_DEFAULTS) -> None:
        """``attach_storage_backend``: ``storage`` becomes this tree's L3 (it outlives the tree; ``reset`` and
        ``flush_cache`` leave it as it is)."""
        if prefetch_policy not in PREFETCH_POLICIES:
            raise ValueError(f"prefetch_policy must be one of {', '.join(PREFETCH_POLICIES)}, got {prefetch_policy!r}")
        self.storage_controller = StorageController(self.cache_controller, storage, self.page_size, read_bytes_per_s,
                                                    write_bytes_per_s, latency_s, prefetch_threshold)
        self.prefetch_stop_policy = prefetch_policy
        self.prefetch_threshold = prefetch_threshold
        self.prefetch_timeout = prefetch_timeout
        self._reset_storage()

    @property
    def enable_storage(self) -> bool:
        return self.storage_controller is not None

    def _reset_storage(self) -> None:
        self.ongoing_prefetch: dict = {}  # req id -> (last_host_node, prefetch tokens, op)
        self._awaiting_slots: dict = {}  # req id -> op: the prefetches whose host slots are not taken yet (in order)
        self.timed_ops: dict = {}  # req id -> op: the prefetches with an event still ahead (storage_next_event_s)
        self.prefetch_loaded_tokens_by_reqid: dict = {}
        # host write op -> (node, its key length): noted by write_backup (two_tier_moves) with a storage tier, taken by
        # writing_check at the copy's ack, which backs the node up to storage (write_backup_storage)
        self._storage_backups: dict[int, tuple[HiTreeNode, int]] = {}
        self._storage_due_s = math.inf  # no backup lands and no prefetch takes its slots before this (less tolerance)
        if self.storage_controller is not None:
            self.storage_controller.reset()

    # -- page keys -----------------------------------------------------------------------------------
    def node_hash(self, node: HiTreeNode) -> list[int]:
        """The storage keys of ``node``'s pages (``compute_node_hash_values``; interned by the store, whose ``hex``
        gives SGLang's), computed on first use down from the deepest ancestor that has them."""
        keys, root = node.hash_value, self.root_node
        if keys is not None and node is not root:  # (most calls: computed already)
            return keys
        parent = node.parent
        if node is not root and (parent is root or parent.hash_value is not None):  # (most others: one node to hash)
            keys = node.hash_value = self.storage_controller.hash_keys(
                node.key, None if parent is root else parent.hash_value[-1])
            return keys
        chain = []
        while node is not root and node.hash_value is None:
            chain.append(node)
            node = node.parent
        hash_keys = self.storage_controller.hash_keys
        for x in reversed(chain):
            x.hash_value = hash_keys(x.key, None if x.parent is root else x.parent.hash_value[-1])
        return chain[0].hash_value if chain else ([] if node is root else node.hash_value)

    def get_last_hash_value(self, node: HiTreeNode) -> int | None:
        return None if node is self.root_node else self.node_hash(node)[-1]

    # -- backup (host -> storage) --------------------------------------------------------------------
    def write_backup_storage(self, node: HiTreeNode, backup_len: int | None = None) -> None:
        """Back ``node``'s pages up to storage (the chain it was split into since, when it was; the node stays
        host-protected until the backup lands)."""
        acc = len(node.key)
        if backup_len is None or acc >= backup_len:  # (most backups: one node, its own key list, which a split
            keys = node.hash_value  # replaces and nothing changes in place)
            if keys is None:
                keys = self.node_hash(node)
        else:
            chain = [node]
            while acc < backup_len and chain[-1].parent is not self.root_node:
                chain.append(chain[-1].parent)
                acc += len(chain[-1].key)
            keys = self.node_hash(node) if acc != backup_len else [
                k for x in reversed(chain) for k in self.node_hash(x)]
        due = self.storage_controller.write_storage(keys, node).finish_s - FINISH_TOLERANCE_S
        if due < self._storage_due_s:
            self._storage_due_s = due
        node.host_ref_counter += 1  # (HiTreeNode.protect_host, inlined: one per backup)

    def _poll_storage(self) -> None:
        """``drain_storage_control_queues``: backups landed release their nodes; prefetches whose hit query has
        answered take their host slots (or are revoked for want of room). Called once ``_storage_due_s`` has come
        (``poll`` checks; most steps: no backup landed and no prefetch's slots are due)."""
        ctl, awaiting, tol = self.storage_controller, self._awaiting_slots, FINISH_TOLERANCE_S
        now, queue = self.cache_controller.now_s, ctl.backup_queue  # (ctl.now_s: the host controller's)
        if queue and queue[0].finish_s - tol <= now:
            for op in ctl.poll_backups(now):
                op.node.release_host()
        if awaiting:  # (most polls: no prefetch waits for its slots)
            for req_id, op in list(awaiting.items()):
                if op.alloc_due_s - tol <= now:
                    if not ctl.allocate(op, self.evict_host_tokens):
                        self._revoke_pending_prefetch(req_id)
                    awaiting.pop(req_id, None)
        due = queue[0].finish_s - tol if queue else math.inf  # (the next backup to land, or prefetch's slots due)
        for op in awaiting.values():
            if op.alloc_due_s - tol < due:
                due = op.alloc_due_s - tol
        self._storage_due_s = due

    def wait_storage_backups(self) -> bool:
        """Write-back with the host pool full of copies still on their way to storage (host-protected until the
        storage ack, so ``evict_host`` skips them): wait for those backups to land, as the eviction waits for its
        host copies (``writing_check(write_back=True)``); the wait is the step's stall. False: none in flight."""
        ctl = self.storage_controller
        if ctl is None or not ctl.backup_queue:
            return False
        self.poll(max(op.finish_s for op in ctl.backup_queue))
        return True

    def retry_write_back(self, node: HiTreeNode, staged: list) -> bool:
        """Write-back eviction, ``node``'s copy refused for want of host room: with a storage tier the room may be
        held by this eviction's own staged copies or by copies on their way to storage (host-protected until they
        land, so neither ``evict_host`` nor ``_drop_subtree_no_host`` may take them). Let them land (the step's
        stall), then try ``node`` once more. kvlab's: 0.5.16 drops the subtree or keeps ``node`` on device though
        its tokens were counted evictable (an out-of-memory prefill)."""
        if self.storage_controller is None:
            return False
        self._flush_staged(staged)
        return self.write_backup(node, write_back=True) > 0

    # -- prefetch (storage -> host) ------------------------------------------------------------------
    def prefetch_from_storage(self, req_id, last_host_node: HiTreeNode, new_input_tokens,
                              last_hash: int | None = None) -> bool:
        """On a request's arrival: fetch the whole pages of ``new_input_tokens`` (its prompt past the host match,
        which ends at ``last_host_node``) that storage holds into host. Nothing under ``prefetch_threshold``
        tokens, while rate-limited, or when storage holds fewer hit tokens than the threshold. Returns whether a
        prefetch is under way."""
        ctl, unit = self.storage_controller, self.key_tokens
        n = len(new_input_tokens) * unit  # (tokens, page aligned; the page tree's keys are pages)
        n -= n % self.page_size
        if ctl is None or not n or n < self.prefetch_threshold or (  # (StorageController.prefetch_rate_limited,
                ctl.prefetch_tokens_occupied >= ctl.prefetch_capacity_limit):  # inlined: a query per arrival)
            return False
        op = ctl.prefetch(req_id, new_input_tokens[: n // unit], last_hash)
        if op is None:  # revoked: too small a hit (most queries: the list of its key is made only for a hit)
            return False
        key = op.token_ids = list(op.token_ids)
        last_host_node.protect_host()
        self.ongoing_prefetch[req_id] = (last_host_node, key, op)
        self._awaiting_slots[req_id] = self.timed_ops[req_id] = op
        self._storage_due_s = min(self._storage_due_s, op.alloc_due_s - FINISH_TOLERANCE_S)
        ctl.prefetch_tokens_occupied += n
        return True

    def _revoke_pending_prefetch(self, req_id) -> None:
        last_host_node, key, _ = self.ongoing_prefetch.pop(req_id)
        self._awaiting_slots.pop(req_id, None)
        last_host_node.release_host()
        self.storage_controller.prefetch_tokens_occupied -= len(key) * self.key_tokens

    def prefetch_timed_out(self, op: PrefetchOperation) -> bool:
        """``_prefetch_timeout_check_linear_func`` (``>=`` where SGLang has ``>``: the modelled clock lands on the
        deadline itself, where a real clock has passed it)."""
        return self.now_s >= self.prefetch_deadline_s(op)

    def prefetch_deadline_s(self, op: PrefetchOperation) -> float:
        """When the ``timeout`` policy stops waiting for ``op``: its start + min(max, base + per_ki * tokens/1024)."""
        base, per_ki, cap = self.prefetch_timeout
        return op.issue_s + min(cap, base + per_ki * len(op.hash_value) * self.page_size / 1024)

    def can_terminate_prefetch(self, op: PrefetchOperation) -> bool:
        policy = self.prefetch_stop_policy
        if policy == "best_effort" or op.terminated:
            return True
        completed = bool(op.hash_value) and op.completed_tokens(self.now_s) == len(op.hash_value) * self.page_size
        if policy == "wait_complete":
            return completed
        return completed or self.prefetch_timed_out(op)

    def check_prefetch_progress(self, req_id) -> bool:
        """Before admission: True when the request has no prefetch or its prefetch may stop now, in which case the
        pages read so far join the tree as host-only nodes (the rest of its host slots are freed)."""
        entry = self.ongoing_prefetch.get(req_id)
        if entry is None:
            return True
        last_host_node, key, op = entry
        if not self.can_terminate_prefetch(op):
            return False
        ctl = self.storage_controller
        completed = ctl.terminate_prefetch(op)
        if op.host_indices is None:  # stopped before its host slots were taken (best_effort, timeout): revoked
            self._revoke_pending_prefetch(req_id)
            self.prefetch_loaded_tokens_by_reqid[req_id] = 0
            return True
        ps = self.page_size
        matched = self._insert_helper_host(last_host_node, array("q", key[: completed // self.key_tokens]),
                                           op.host_indices[:completed], op.hash_value[: completed // ps])
        ctl.mem_pool_host.free(op.host_indices[:matched])
        ctl.mem_pool_host.free(op.host_indices[completed:])
        self._revoke_pending_prefetch(req_id)  # (the start node released, the occupied tokens returned)
        self.prefetch_loaded_tokens_by_reqid[req_id] = completed - matched
        return True

    def pop_prefetch_loaded_tokens(self, req_id) -> int:
        return self.prefetch_loaded_tokens_by_reqid.pop(req_id, 0)

    def _insert_helper_host(self, node: HiTreeNode, key: array, host_value, hash_value: list) -> int:
        """Hang ``key`` (read from storage into ``host_value``, host slots of its tokens) below ``node`` as
        host-only nodes; returns the tokens already in the tree (their host slots are the caller's to free)."""
        return self._hang_host_only(node, key, host_value, hash_value) * self.key_tokens

    def _hang_host_only(self, node: HiTreeNode, key: array, host_value, hash_value: list) -> int:
        """:meth:`_insert_helper_host` in key elements (``len(key)``: none hung, all to be freed)."""
        tick, ps = self.clock.tick, self.page_size // self.key_tokens  # (a page in key elements)
        node.last_access_time = tick()
        self._touch(node)  # (a leaf's sort key changed: a fresh heap entry)
        matched, off, n = 0, 0, len(key)
        while off < n:
            child = node.children.get(self._key_of(key, off))
            if child is None:
                break
            child.last_access_time = tick()
            self._touch(child)
            m = align_down(common_prefix_len(child.key, key, off, n), ps)
            node = self._split_node(child, m) if m < len(child.key) else child
            matched += m
            off += m
            if node.host_value is None:  # (see the module docstring) not hung below a node with no host copy
                return n
        if off < n:
            new = self._new_node(key[off:], None, node, node.priority)
            new.host_value = self._host_part(host_value, off, n)  # (a slice of what the host pool handed out)
            new.hash_value = list(hash_value[off // ps :])
            node.children[self._key_of(new.key)] = new
            self.structure_version += 1
            self._update_host_leaf_status(new)
            self._update_leaf_status(node)
            self._update_host_leaf_status(node)
        return matched

    # -- flush, clock, check -------------------------------------------------------------------------
    def flush_cache(self) -> bool:
        """``/flush_cache``: empty the device and host tiers (the tree, both pools), not storage. Refused (False)
        while a request holds a node or a copy is in flight, as SGLang refuses while requests run."""
        if self.protected_size_ or self.cache_controller.in_flight() or (
                self.storage_controller is not None and (self.ongoing_prefetch or self.storage_controller.backup_queue)):
            return False
        self.reset()
        return True

    def storage_next_event_s(self) -> float:
        """The next clock time at which a storage event changes what the scheduler sees: a backup landing, or a
        prefetch's host slots taken, its last page landing or its timeout. Only events still ahead count: one the
        clock has passed changed what it changes already (a waiting prefetch done long ago no longer stops the
        quiet decode rounds at every step)."""
        ctl, timed = self.storage_controller, self.timed_ops
        queue = ctl.backup_queue
        nxt = queue[0].finish_s if queue else math.inf  # (next_backup_s)
        if not timed:  # (most steps: no prefetch with an event ahead)
            return nxt
        timeout, ongoing = self.prefetch_stop_policy == "timeout", self.ongoing_prefetch
        now = ctl.now_s
        ahead = now + FINISH_TOLERANCE_S  # (a slot take or a page lands within the tolerance: already seen)
        for req_id, op in list(timed.items()):
            entry = ongoing.get(req_id)
            deadline = self.prefetch_deadline_s(op) if timeout else 0.0
            # its slots taken, or its last page (fixed once begun; a read not begun only moves earlier)
            end = op.alloc_due_s if op.host_indices is None else op.finish_s
            if entry is None or entry[2] is not op or (op.host_indices is not None and end <= ahead and deadline <= now):
                del timed[req_id]  # (gone, or nothing of it ahead any more)
                continue
            if ahead < end < nxt:
                nxt = end
            if now < deadline < nxt:
                nxt = deadline
        return nxt

    def check_storage_invariants(self) -> None:
        """The storage tier: the store within its capacity; each prefetch's start node host-protected and backed
        up, its host slots allocated and in no node; the occupied count the prefetches' tokens; each node's keys
        one per page."""
        ctl = self.storage_controller
        if ctl is None:
            return
        ctl.storage.check_invariants()
        ps = self.page_size
        for node, _, op in self.ongoing_prefetch.values():
            require(node.host_ref_counter > 0 and node.host_value is not None,
                    "HiRadixCache: a prefetch's start node is backed up and host-protected", node=node)
            require(len(op.hash_value) * ps == op.storage_hit_count and (
                op.host_indices is None or len(op.host_indices) == op.storage_hit_count),
                "HiRadixCache: a prefetch holds host slots for exactly its hit pages (once taken)",
                hit=op.storage_hit_count)
        require(ctl.prefetch_tokens_occupied == sum(len(k) for _, k, _ in self.ongoing_prefetch.values()) * self.key_tokens,
                "HiRadixCache: prefetch_tokens_occupied counts the prefetches in flight",
                occupied=ctl.prefetch_tokens_occupied)
        for op in ctl.backup_queue:
            require(op.node.host_ref_counter > 0, "HiRadixCache: a node backing up to storage is host-protected",
                    node=op.node)
        starts = [op.start_s for op in ctl.reading]
        require(starts == sorted(starts), "HiRadixCache: the prefetch reads start in channel order (FIFO)",
                starts=starts[:8])
        for node in self.nodes():
            if node is not self.root_node and node.hash_value is not None:
                require(len(node.hash_value) * ps == len(node.key) * self.key_tokens, "HiRadixCache: a node has one storage key per "
                        "page", node=node, keys=len(node.hash_value))

    def prefetch_host_slots(self) -> list:
        """Host slots held by prefetches in flight (allocated, not yet in the tree)."""
        return [op.host_indices for _, _, op in self.ongoing_prefetch.values() if op.host_indices is not None]

    def _host_part(self, host_value, start: int, end: int):
        """A host-only node's slots: ``host_value[start:end]`` (the page tree's ``True``)."""
        return host_value[start:end]

    def evict_host_tokens(self, tokens: int) -> int:
        """Host eviction for ``tokens`` (the page tree's ``evict_host`` counts pages)."""
        return self.evict_host(tokens)
