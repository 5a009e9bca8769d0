"""The page engine's tree (``kvlab.mem_cache.page_tree``): :class:`PageKeys` against a plain dict of page contents,
and :class:`PageRadixTree` against the token-level paged :class:`RadixCache` it rewrites, op for op (matches,
inserts, locks, evictions under every policy): the same matched lengths, clock, sizes, victims and final tree."""

import random

import pytest
from fuzz import fuzz_settings, record
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from kvlab.mem_cache.allocator import PagedTokenToKVPoolAllocator
from kvlab.mem_cache.evict_policy import EVICTION_POLICIES
from kvlab.mem_cache.page_tree import PageKeys, PageRadixTree
from kvlab.mem_cache.radix_cache import RadixCache
from kvlab.mem_cache.tree_view import tree_frame
from kvlab.workloads.request import TokenSequence

# -- PageKeys ---------------------------------------------------------------------------------------------------


@st.composite
def segments(draw, page_size):
    """Segments of a TokenSequence: ranges (aligned or not, shorter or longer than a page, some continuing the
    previous range) and tuples (random tokens, or consecutive ints that happen to spell a range page)."""
    out = []
    for _ in range(draw(st.integers(0, 8))):
        kind = draw(st.sampled_from(["range", "continue", "tuple", "consecutive_tuple"]))
        n = draw(st.integers(1, 3 * page_size + 1))
        if kind == "continue" and out and type(out[-1]) is range:
            start = out[-1].stop
        elif kind in ("range", "continue"):
            start = draw(st.sampled_from([0, page_size, 3 * page_size, draw(st.integers(0, 40))]))
        if kind in ("range", "continue"):
            out.append(range(start, start + n))
        elif kind == "tuple":
            out.append(tuple(draw(st.lists(st.integers(0, 12), min_size=n, max_size=n))))
        else:
            start = draw(st.integers(0, 40))
            out.append(tuple(range(start, start + n)))
    return out


@fuzz_settings("page_keys", suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), page_size=st.integers(2, 8))
def test_page_keys_of_a_sequence_are_the_ids_of_its_pages(data, page_size):
    """Whatever the segments, ``of_sequence`` gives each whole page the id ``of_tokens`` gives its tokens; equal
    contents get equal ids and different contents different ids; ``tokens`` spells the pages back."""
    record("page_keys")
    keys = PageKeys(page_size)
    seen: dict[tuple, int] = {}  # page contents -> id, across all sequences of this example
    for _ in range(data.draw(st.integers(1, 3))):
        segs = data.draw(segments(page_size))
        seq = TokenSequence.from_segments(segs)
        flat = [t for s in segs for t in s]
        assert list(seq) == flat
        n = len(flat) // page_size
        pages = [tuple(flat[p * page_size : (p + 1) * page_size]) for p in range(n)]
        ids = keys.of_sequence(seq, n)
        assert list(ids) == [keys.of_tokens(p) for p in pages]
        for plain in (flat, tuple(flat)):  # plain sequences: the same ids
            assert list(keys.of_sequence(plain, n)) == list(ids)
        assert list(keys.of_sequence(seq, n // 2)) == list(ids[: n // 2])  # a prefix of the pages
        for page, i in zip(pages, ids):
            assert seen.setdefault(page, i) == i
            if page == tuple(range(page[0], page[0] + page_size)):
                assert i == page[0]  # a consecutive page is its first token, however it was stored
            else:
                assert i < 0
        assert len(set(seen.values())) == len(seen)  # different contents, different ids
        assert list(keys.tokens(ids)) == flat[: n * page_size]


def test_page_keys_refuse_pages_of_one_token():
    with pytest.raises(Exception, match="page_size"):
        PageKeys(1)


# -- PageRadixTree against RadixCache ---------------------------------------------------------------------------

POLICIES = sorted(EVICTION_POLICIES)


class Twins:
    """A PageRadixTree and a paged RadixCache (real allocator and slots) driven by the same operations."""

    def __init__(self, page_size, policy):
        self.ps = page_size
        self.keys = PageKeys(page_size)
        self.pt = PageRadixTree(policy)
        self.kv_tokens = 4096 * page_size
        self.alloc = PagedTokenToKVPoolAllocator(self.kv_tokens, page_size)
        self.rc = RadixCache(token_to_kv_pool_allocator=self.alloc, page_size=page_size, eviction_policy=policy)
        self.locked: list = []  # (page node, token node) pairs locked by a match

    def page_key(self, tokens):
        n = len(tokens) // self.ps
        return self.keys.of_sequence(tokens, n), n

    def match(self, tokens, lock):
        key, n = self.page_key(tokens)
        node, pages = self.pt.match_prefix(key, n)
        m = self.rc.match_prefix(tokens)
        assert pages * self.ps == m.device_prefix_len
        assert node.id == m.last_device_node.id
        if lock:
            self.pt.inc_lock_ref(node)
            self.rc.inc_lock_ref(m.last_device_node)
            self.locked.append((node, m.last_device_node))

    def insert(self, tokens, inserted_pages, priority):
        key, n = self.page_key(tokens)
        done, _ = self.pt.insert(key, n, priority, inserted_pages)
        value = self.alloc.alloc(n * self.ps)
        assert value is not None
        rc_done = self.rc.insert(tokens, value, priority=priority, inserted_len=inserted_pages * self.ps)
        assert done * self.ps == rc_done
        self.alloc.free(value[:rc_done])  # the duplicates: the tree keeps its own slots for them

    def unlock(self, i):
        node, twin = self.locked.pop(i)
        self.pt.dec_lock_ref(node)
        self.rc.dec_lock_ref(twin)

    def evict(self, pages):
        freed = self.pt.evict(pages)
        res = self.rc.evict(pages * self.ps)
        assert freed * self.ps == res.num_tokens_evicted

    def check(self):
        pt, rc = self.pt, self.rc
        pt.check_invariants()
        rc.check_invariants()
        self.alloc.check_invariants()
        assert pt.evictable_size_ * self.ps == rc.evictable_size_
        assert pt.protected_size_ * self.ps == rc.protected_size_
        assert pt.clock.now == rc.clock.now
        assert pt.structure_version == rc.structure_version
        assert self.alloc.available_size() == self.kv_tokens - rc.total_size()

    def check_final(self):
        rebuilt = self.pt.to_radix_cache(self.keys, self.kv_tokens)
        rebuilt.check_invariants()
        assert tree_frame(rebuilt).equals(tree_frame(self.rc))

        def fields(cache):
            out, stack = {}, [cache.root_node]
            while stack:
                node = stack.pop()
                out[node.id] = (list(node.key), node.parent.id if node.parent else None, node.last_access_time,
                                node.creation_time, node.hit_count, node.priority, node.lock_ref)
                stack.extend(node.children.values())
            return out

        assert fields(rebuilt) == fields(self.rc)
        assert rebuilt.clock.now == self.rc.clock.now and rebuilt.structure_version == self.rc.structure_version


@fuzz_settings("page_tree", suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**32 - 1), page_size=st.sampled_from([2, 3, 4, 8]), policy=st.sampled_from(POLICIES),
       steps=st.integers(1, 60))
def test_page_tree_does_what_the_paged_radix_cache_does(seed, page_size, policy, steps):
    """Keys made of a few shared pages (prefixes overlap, so nodes split), some with a partial last page; every
    op compared as it returns, the bookkeeping after it, and the final trees node for node."""
    record("page_tree")
    rng = random.Random(seed)
    ps = page_size
    pool = [tuple(rng.randrange(0, 6) for _ in range(ps)) for _ in range(rng.randrange(2, 5))]
    pool += [tuple(range(s, s + ps)) for s in rng.sample(range(0, 40), 2)]  # consecutive pages (ids >= 0)
    prefixes = [[rng.choice(pool) for _ in range(rng.randrange(1, 4))] for _ in range(3)]
    t = Twins(ps, policy)

    def tokens():
        pages = list(rng.choice(prefixes))[: rng.randrange(0, 4)] + [rng.choice(pool)
                                                                    for _ in range(rng.randrange(0, 4))]
        flat = [x for p in pages for x in p] + [rng.randrange(0, 6) for _ in range(rng.choice([0, 0, 1, ps - 1]))]
        return flat

    for _ in range(steps):
        op = rng.random()
        if op < 0.3:
            t.match(tokens(), lock=rng.random() < 0.4)
        elif op < 0.55:
            toks = tokens()
            t.insert(toks, rng.choice([0, 0, rng.randrange(0, len(toks) // ps + 1)]), rng.choice([0, 0, 1, 5]))
        elif op < 0.65:  # a chunked request: its first k pages, then all of them with inserted_len = k pages
            toks = tokens()
            k = rng.randrange(0, len(toks) // ps + 1)
            t.insert(toks[: k * ps], 0, 0)
            t.check()
            t.insert(toks, k, 0)
        elif op < 0.8 and t.locked:
            t.unlock(rng.randrange(len(t.locked)))
        else:
            t.evict(rng.randrange(1, 6))
        t.check()
    t.check_final()
    while t.locked:
        t.unlock(0)
        t.check()
    t.evict(10**6)
    t.check()
    assert t.pt.total_size() == 0 and t.alloc.available_size() == t.kv_tokens
    t.check_final()


@pytest.mark.parametrize("policy", POLICIES)
def test_every_policy_evicts_in_the_radix_cache_order(policy):
    """A fixed history where the victim order matters (hits, priorities, ages): one page at a time, the same
    victims as the token-level cache, under each policy."""
    ps = 4
    t = Twins(ps, policy)
    pages = [tuple(range(s, s + ps)) for s in (0, 100, 200, 300)] + [(7, 7, 7, 7), (1, 2, 2, 1)]
    for i, (a, b) in enumerate([(0, 1), (0, 2), (3, 4), (5, 1), (0, 1), (3, 5)]):
        t.insert(list(pages[a] + pages[b]), 0, i % 3)
        t.check()
    t.match(list(pages[3] + pages[4]), lock=False)
    t.match(list(pages[0] + pages[2]), lock=False)
    t.check()
    for _ in range(4):
        before = {n.id for n in t.pt.nodes()}
        t.evict(1)
        t.check()
        t.check_final()
        assert len(before) - len(list(t.pt.nodes())) == 1  # one leaf a time, the same one (check_final)


def test_pages_are_in_pages_not_tokens():
    ps = 4
    keys = PageKeys(ps)
    tree = PageRadixTree()
    key = keys.of_sequence(list(range(8, 20)) + [5, 5, 5, 5], 4)
    assert list(key) == [8, 12, 16, -1]
    assert tree.insert(key, 4) == (0, tree.root_node.children[8])
    assert tree.evictable_size_ == 4
    node, n = tree.match_prefix(keys.of_sequence(list(range(8, 16)) + [1] * 4, 3), 3)
    assert n == 2 and len(node.key) == 2 and tree.evictable_size_ == 4  # split at the page boundary
    tree.check_invariants()
