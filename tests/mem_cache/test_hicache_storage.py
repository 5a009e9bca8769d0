"""The storage tier (L3) of the two-tier tree: page keys, the store's capacity, backups under each write policy,
prefetch under each policy, the prefetch threshold and rate limit, ``/flush_cache``, and a property test driving
``check_invariants`` over random interleavings.

SGLang's controller threads need CUDA streams and a running server (docs/testing.md), so its own storage tests are
re-expressed here: ``test/srt/hicache/test_hicache_storage_file_backend.py::test_basic_backup_and_prefetch`` (a
768-token prompt, flushed, sent again: more than 700 cached tokens, read back from the file backend under
``wait_complete``) is :func:`test_sglang_basic_backup_and_prefetch`.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvlab.mem_cache.allocator import PagedTokenToKVPoolAllocator
from kvlab.mem_cache.hicache import HiRadixCache, HostKVCache
from kvlab.mem_cache.hicache.storage import HiCacheStorage, RecencyLog, get_hash_str

PS = 4
BYTES_PER_TOKEN = 16
PAGE_BYTES = PS * BYTES_PER_TOKEN


def make_tree(storage: HiCacheStorage, policy: str = "best_effort", write_policy: str = "write_through",
              device: int = 64, threshold: int = 8, bw: float = 64.0, timeout=(2.0, 0.1, 30.0)):
    alloc = PagedTokenToKVPoolAllocator(device, PS)
    host = HostKVCache(device, BYTES_PER_TOKEN, PS, hicache_ratio=2.0)
    tree = HiRadixCache(None, alloc, host, page_size=PS, write_policy=write_policy)
    tree.attach_storage(storage, read_bytes_per_s=bw, write_bytes_per_s=bw, latency_s=0.0, prefetch_policy=policy,
                        prefetch_threshold=threshold, prefetch_timeout=timeout)
    return tree, alloc


def fill(tree, alloc, key) -> None:
    tree.insert(key, alloc.alloc(len(key)))


KEY = list(range(1, 17))  # 4 pages


def test_interned_keys_are_get_hash_strs_chain_on_demand():
    """A store interns each page's key as an int (the previous page's key and the page's tokens); its hex, computed
    only when asked for, is ``get_hash_str``'s: pages of consecutive ids (a trace's blocks) or of any ids, ids past
    uint32, a partial last page, a chain resumed from a prior key. The page engine's keys (its pages by id) are the
    token tree's, and a store given keys as strings (another run's hex) still finds the interned ones."""
    from kvlab.mem_cache.page_tree import PageKeys

    rng = random.Random(3)
    store = HiCacheStorage(PAGE_BYTES)
    for _ in range(300):
        ps = rng.choice([1, 2, 4, 16])
        if rng.random() < 0.5:
            first = rng.choice([0, 5, 2**32 - 20, 2**32 - 3, 2**40])
            tokens = list(range(first, first + rng.randrange(1, 40)))
        else:
            tokens = [rng.randrange(0, 2**33) for _ in range(rng.randrange(1, 40))]
        keys = store.page_ids(tokens, None, ps)
        assert [store.hex(k) for k in keys] == get_hash_str(tokens, None, ps)
        cut = rng.randrange(len(keys))
        if cut:
            assert store.page_ids(tokens[cut * ps :], keys[cut - 1], ps) == keys[cut:]
    page_keys = PageKeys(PS)
    tokens = list(range(100, 116)) + [7, 3, 9, 1] + list(range(2**32 - 4, 2**32 + 4))
    pages = page_keys.of_sequence(tokens, len(tokens) // PS)
    assert store.chain(PS, page_keys.page, pages, None) == store.page_ids(tokens, None, PS)
    named = HiCacheStorage(PAGE_BYTES)
    early = named.page_ids(KEY, None, PS)
    assert named.batch_set(early[:2], interned=True) == 2 and named.batch_set(get_hash_str(KEY, None, PS)[2:]) == 2
    assert named.keys() == get_hash_str(KEY, None, PS) and named.batch_exists(early, interned=True) == 4


def test_interned_keys_are_equal_exactly_when_their_hex_is():
    """Chains that share prefixes and branch (a few pages in every order, runs and pages of tokens, chains made
    at once, resumed from a key, and walked again): two pages get the same key exactly when their
    ``get_hash_str`` keys are equal, so a chain found again is the same keys and a branch is new ones."""
    from kvlab.mem_cache.page_tree import PageKeys

    rng, ps = random.Random(11), 4
    page_keys = PageKeys(ps)
    pages = page_keys.of_sequence(list(range(40, 60)) + [9, 2, 7, 5, 1, 1, 1, 1], 7)  # 5 runs, 2 of tokens
    store, by_hex = HiCacheStorage(PAGE_BYTES), {}
    for _ in range(400):
        ids = [rng.choice(pages[:3]) if rng.random() < 0.7 else rng.choice(pages) for _ in range(rng.randrange(1, 9))]
        cut = rng.randrange(len(ids))
        head = store.chain(ps, page_keys.page, ids[:cut], None)
        keys = head + store.chain(ps, page_keys.page, ids[cut:], head[-1] if head else None)
        tokens = [t for i in ids for t in page_keys.page(i)]
        assert [store.hex(k) for k in keys] == get_hash_str(tokens, None, ps)
        for key, hx in zip(keys, get_hash_str(tokens, None, ps)):
            assert by_hex.setdefault(hx, key) == key
    assert len(set(by_hex.values())) == len(by_hex)


def test_pages_of_tokens_after_one_prior_keep_their_keys_past_the_first_few():
    """Many pages of tokens after one prior (the first few found by comparing tokens, then filed by their code):
    each keeps its key whenever chained again, before and after the filing, and each new one gets a new key whose
    hex is ``get_hash_str``'s."""
    rng = random.Random(5)
    store = HiCacheStorage(PAGE_BYTES)
    run = store.page_ids(list(range(PS)), None, PS)[0]
    pages = [[rng.randrange(2**20) for _ in range(PS)] for _ in range(12)]
    for prior, prior_hex in ((None, None), (run, get_hash_str(list(range(PS)), None, PS)[0])):
        keys = []
        for page in pages:
            keys.append(store.page_ids(page, prior, PS)[0])
            assert store.hex(keys[-1]) == get_hash_str(page, prior_hex, PS)[0]
            assert [store.page_ids(q, prior, PS)[0] for q in pages[: len(keys)]] == keys
        assert len(set(keys)) == len(keys)
    store.check_invariants()


@pytest.mark.parametrize("ranged", [True, False])
def test_a_storage_query_keys_no_page_past_the_first_never_interned(ranged):
    """A prefetch's hit query (``known``) keys the pages up to the first this store never interned, which no store
    of its keys holds: the same keys as the full chain's up to there, the same hit count, and nothing interned by
    it (keying the pages afterwards gives the keys they would have had). Pages of consecutive ids are found by
    their first id; other pages (``ranged`` False) are interned as without ``known``."""
    rng = random.Random(7)
    pages = [list(range(PS * i, PS * i + PS)) if ranged else [rng.randrange(1, 2**20) for _ in range(PS)]
             for i in range(6)]
    tokens = [t for page in pages for t in page]
    store, full = HiCacheStorage(PAGE_BYTES), HiCacheStorage(PAGE_BYTES)
    stored = store.page_ids(tokens[: 3 * PS], None, PS)
    store.batch_set(stored[:2])
    full.batch_set(full.page_ids(tokens[: 2 * PS], None, PS))
    query = store.page_ids(tokens, None, PS, known=True)
    everything = full.page_ids(tokens, None, PS)
    assert query == (stored if ranged else store.page_ids(tokens, None, PS))
    assert store.batch_exists(query, interned=True) == full.batch_exists(everything, interned=True) == 2
    assert [store.hex(k) for k in store.page_ids(tokens, None, PS)] == get_hash_str(tokens, None, PS)
    store.check_invariants()


def test_page_keys_chain_on_the_prefix():
    """A page's key names its whole prefix: the keys of a prefix are a prefix of the keys, and hashing on from the
    last key of a page-aligned part gives the rest (the prefetch's last_hash)."""
    keys = get_hash_str(KEY, None, PS)
    assert len(keys) == 4 and len(set(keys)) == 4
    assert get_hash_str(KEY[:8], None, PS) == keys[:2]
    assert get_hash_str(KEY[8:], keys[1], PS) == keys[2:]
    assert get_hash_str(KEY[8:], None, PS) != keys[2:]


def test_unbounded_store_never_evicts_and_a_bounded_one_evicts_to_its_ratio():
    free = HiCacheStorage(PAGE_BYTES)
    assert free.batch_set([f"k{i}" for i in range(1000)]) == 1000 and free.evicted_pages == 0
    bounded = HiCacheStorage(PAGE_BYTES, 10 * PAGE_BYTES)
    bounded.batch_set([f"k{i}" for i in range(10)])
    bounded.get("k0")  # most recent now
    assert bounded.set("new")
    # 9 pages of room at ratio 0.9, less the new page: 8 kept of the old, the new one added
    assert len(bounded) == 9 and bounded.exists("k0") and not bounded.exists("k1") and bounded.exists("new")
    assert not HiCacheStorage(PAGE_BYTES, PAGE_BYTES - 1).set("too-big")


@pytest.mark.parametrize("capacity_pages", [None, 100])
def test_a_store_lists_its_keys_least_recently_used_first(capacity_pages):
    """Unbounded (a RecencyLog) or bounded (evicting by it): a key set or read again moves to the end, in a batch
    too, and a key given twice in one batch ends where its last copy is."""
    store = HiCacheStorage(PAGE_BYTES, capacity_pages and capacity_pages * PAGE_BYTES)
    assert store.batch_set(["a", "b", "c", "d"]) == 4 and store.get("b") and not store.get("z")
    assert store.set("a") and store.batch_set(["e", "c", "f", "e"]) == 4
    assert store.keys() == ["d", "b", "a", "c", "f", "e"] and store.exists("d") and len(store) == 6


@settings(max_examples=200, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["extend", "move", "set", "clear", "read"]),
                              st.lists(st.integers(0, 12), max_size=40)), max_size=60))
def test_a_recency_log_keeps_the_order_of_a_dict_refreshed_by_reinsertion(ops):
    """RecencyLog (an unbounded store's keys) against the dict it stands for: a stored or refreshed key taken out
    and put back at the end; membership, size and order equal after every operation, through its compactions."""
    log, model = RecencyLog(), {}
    for op, keys in ops:
        if op == "extend":
            log.extend(keys)
            for k in keys:
                model.pop(k, None)
                model[k] = None
        elif op in ("move", "set") and keys and (op == "set" or keys[0] in model):  # (move: a stored key)
            if op == "move":
                log.move_to_end(keys[0])
            else:
                log[keys[0]] = None
            model.pop(keys[0], None)
            model[keys[0]] = None
        elif op == "clear":
            log.clear()
            model.clear()
        elif op == "read":
            assert list(log) == list(model)
        assert len(log) == len(model) and all((k in log) == (k in model) for k in range(13))
        log.check_invariants()
    assert list(log) == list(model)


@pytest.mark.parametrize("write_policy", ["write_through", "write_through_selective", "write_back"])
def test_pages_reach_storage_when_their_host_copy_lands(write_policy):
    """write_through: at the first insert; write_through_selective: at the second hit; write_back: at the device
    eviction that writes them to host. Each node's pages arrive with their chained keys."""
    store = HiCacheStorage(PAGE_BYTES)
    tree, alloc = make_tree(store, write_policy=write_policy)
    fill(tree, alloc, KEY)
    tree.drain()
    stored_first = len(store)
    if write_policy == "write_through_selective":
        tree.match_prefix(KEY)
        fill(tree, alloc, KEY)  # the second hit
    elif write_policy == "write_back":
        tree.evict(16)
    tree.drain()
    tree.check_invariants()
    assert stored_first == (4 if write_policy == "write_through" else 0)
    assert store.keys() == get_hash_str(KEY, None, PS)
    assert tree.storage_controller.totals.written_to_storage_tokens == 16


def stored_tree(policy, **kw):
    """A store holding KEY, and a fresh tree (a flushed server) on it."""
    store = HiCacheStorage(PAGE_BYTES)
    first, alloc = make_tree(store)
    fill(first, alloc, KEY)
    first.drain()
    return make_tree(store, policy, **kw)[0]


@pytest.mark.parametrize("policy, when, done, loaded", [
    ("best_effort", 0.0, True, 0),  # scheduled at once: nothing has landed yet
    ("best_effort", 1.5, True, 4),  # one page (16 B/token * 4 / 64 B/s = 1 s per page) landed
    ("wait_complete", 3.5, False, None),
    ("wait_complete", 4.0, True, 16),
    ("timeout", 1.9, False, None),
    ("timeout", 2.0 + 0.1 * 16 / 1024, True, 8),  # base + per_ki_token * tokens / 1024: two pages by then
])
def test_prefetch_policies(policy, when, done, loaded):
    tree = stored_tree(policy)
    assert tree.prefetch_from_storage("r", tree.root_node, KEY + [99], None)
    tree.poll(0.0)  # the next check_hicache_events: the hit's host slots are taken, the read starts
    tree.poll(when)
    assert tree.check_prefetch_progress("r") is done
    tree.check_invariants()
    if done:
        assert tree.pop_prefetch_loaded_tokens("r") == loaded
        m = tree.match_prefix(KEY)
        assert m.device_prefix_len == 0 and m.host_hit_length == loaded
        totals = tree.storage_controller.totals
        assert totals.prefetched_tokens == loaded and totals.prefetch_aborted_tokens == 16 - loaded
        assert tree.token_to_kv_pool_host.used_size() == loaded  # the unread pages' host slots are free again


def test_prefetch_threshold_and_rate_limit():
    tree = stored_tree("wait_complete", threshold=20)  # 16 tokens stored: under the threshold, revoked
    assert not tree.prefetch_from_storage("r", tree.root_node, KEY + [99], None)
    assert tree.check_prefetch_progress("r") and tree.token_to_kv_pool_host.used_size() == 0
    tree = stored_tree("wait_complete")
    ctl = tree.storage_controller
    ctl.prefetch_tokens_occupied = ctl.prefetch_capacity_limit  # half the host pool held by prefetches
    assert not tree.prefetch_from_storage("r", tree.root_node, KEY + [99], None)


def test_flush_cache_clears_device_and_host_not_storage():
    store = HiCacheStorage(PAGE_BYTES)
    tree, alloc = make_tree(store)
    fill(tree, alloc, KEY)
    node = tree.match_prefix(KEY).last_device_node
    tree.inc_lock_ref(node)
    assert not tree.flush_cache()  # a request holds it
    tree.dec_lock_ref(node)
    tree.drain()
    assert tree.flush_cache()
    tree.check_invariants()
    assert tree.total_size() == 0 and tree.token_to_kv_pool_host.used_size() == 0 and len(store) == 4


def test_sglang_basic_backup_and_prefetch():
    """SGLang's test_basic_backup_and_prefetch (file backend, wait_complete, page 64): a 768-token prompt is
    cached, the cache flushed, the prompt sent again: more than 700 of its tokens come back from storage."""
    ps = 64
    store = HiCacheStorage(ps * BYTES_PER_TOKEN)
    alloc = PagedTokenToKVPoolAllocator(2048, ps)
    tree = HiRadixCache(None, alloc, HostKVCache(2048, BYTES_PER_TOKEN, ps, hicache_ratio=1.2), page_size=ps)
    tree.attach_storage(store, read_bytes_per_s=5e9, write_bytes_per_s=5e9, latency_s=1e-4,
                        prefetch_policy="wait_complete")
    prompt = [random.Random(0).randrange(1, 32000) for _ in range(768)]
    tree.insert(prompt, alloc.alloc(768))
    tree.drain()
    assert tree.flush_cache()
    new_tokens = prompt[: len(prompt) - 1]  # the match stops one token short (_compute_max_prefix_len)
    assert tree.prefetch_from_storage("again", tree.root_node, new_tokens, None)
    while not tree.check_prefetch_progress("again"):
        tree.advance(1e-3)
    cached = tree.pop_prefetch_loaded_tokens("again")
    assert cached > 700 and tree.match_prefix(prompt).host_hit_length == cached


OPS = st.lists(st.tuples(st.sampled_from(["insert", "match", "evict", "prefetch", "check", "advance", "evict_host",
                                          "flush"]),
                         st.integers(0, 7), st.integers(1, 6)), min_size=1, max_size=40)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=OPS, policy=st.sampled_from(["best_effort", "wait_complete", "timeout"]),
       write_policy=st.sampled_from(["write_through", "write_through_selective", "write_back"]),
       cap=st.sampled_from([None, 6, 12]))
def test_storage_tier_keeps_its_invariants(ops, policy, write_policy, cap):
    """Random inserts, matches, evictions, prefetches, progress checks and clock moves over prompts that share
    prefixes; check_invariants after every op (the store within capacity, prefetch slots accounted for, keys one
    per page, backing-up nodes host-protected), and every prefetch eventually lets its request go. A flush leaves
    what storage holds as the only copy, so later prefetches find it."""
    store = HiCacheStorage(PAGE_BYTES, cap and cap * PAGE_BYTES)
    tree, alloc = make_tree(store, policy, write_policy, device=48, threshold=PS, timeout=(1.0, 0.1, 30.0))
    prompts = [[1 + (i % 3)] * 4 + [10 + i] * (4 * (1 + i % 3)) for i in range(8)]
    pending = set()
    for op, i, n in ops:
        key = prompts[i]
        if op == "insert":
            slots = alloc.alloc(len(key))
            if slots is None:
                tree.evict(len(key))
                slots = alloc.alloc(len(key))
            if slots is not None:
                done = tree.insert(key, slots)
                alloc.free(slots[:done])
        elif op == "match":
            tree.match_prefix(key)
        elif op == "evict":
            tree.evict(n * PS)
        elif op == "evict_host":
            tree.evict_host(n * PS)
        elif op == "prefetch" and i not in pending:
            m = tree.match_prefix(key)
            start = m.device_prefix_len + m.host_hit_length
            if tree.prefetch_from_storage(i, m.last_host_node, key[start:], tree.get_last_hash_value(m.last_host_node)):
                pending.add(i)
        elif op == "check" and i in pending:
            if tree.check_prefetch_progress(i):
                pending.discard(i)
        elif op == "advance":
            tree.advance(n * 0.5)
        elif op == "flush":  # (refused while a copy, prefetch or backup is in flight)
            tree.flush_cache()
        tree.check_invariants()
    tree.advance(100.0)
    for i in sorted(pending):
        assert tree.check_prefetch_progress(i)
    tree.drain()
    tree.check_invariants()
    assert not tree.ongoing_prefetch and not tree.storage_controller.backup_queue


def test_a_zero_threshold_never_waits_for_nothing():
    """With ``prefetch_threshold`` 0, a prompt storage holds none of (or an empty one) starts no prefetch, so
    ``wait_complete`` cannot wait forever for a read of zero pages."""
    tree, _ = make_tree(HiCacheStorage(PAGE_BYTES), "wait_complete", threshold=0)
    assert not tree.prefetch_from_storage("r", tree.root_node, KEY, None)
    assert not tree.prefetch_from_storage("e", tree.root_node, [], None)
    assert tree.check_prefetch_progress("r") and tree.check_prefetch_progress("e")


def test_two_prefetches_of_the_same_pages_keep_the_host_heap_current():
    """The second of two prefetches of the same pages finds them already hung in the tree by the first: its walk
    touches that host-only leaf, which must get a fresh heap entry (check_invariants: a live entry with its current
    sort key). The second request's pages are all freed and count as not loaded from storage."""
    tree = stored_tree("wait_complete")
    assert tree.prefetch_from_storage("a", tree.root_node, KEY, None)
    assert tree.prefetch_from_storage("b", tree.root_node, KEY, None)
    tree.poll(0.0)
    tree.poll(10.0)
    assert tree.check_prefetch_progress("a") and tree.check_prefetch_progress("b")
    tree.check_invariants()
    assert tree.pop_prefetch_loaded_tokens("a") == 16 and tree.pop_prefetch_loaded_tokens("b") == 0
    assert tree.token_to_kv_pool_host.used_size() == 16


@pytest.mark.parametrize("policy", ["best_effort", "timeout"])
def test_a_request_scheduled_before_its_host_slots_are_taken_gets_nothing(policy):
    """SGLang takes a prefetch's host slots only at the next check_hicache_events after its hit query: a request
    scheduled before then (best_effort, or a timeout already past) revokes it, and the host pool is never touched
    (no host copy evicted to make room for pages nobody reads)."""
    tree = stored_tree(policy, timeout=(0.0, 0.0, 0.0))
    assert tree.prefetch_from_storage("r", tree.root_node, KEY + [99], None)
    assert tree.check_prefetch_progress("r") and tree.pop_prefetch_loaded_tokens("r") == 0
    tree.check_invariants()
    assert tree.token_to_kv_pool_host.used_size() == 0 and not tree.ongoing_prefetch
    assert tree.storage_controller.totals.prefetch_aborted_tokens == 16
