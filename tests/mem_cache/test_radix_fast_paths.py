"""RadixCache's walk shortcuts have the effects of the plain walk, node by node.

- ``insert`` right after ``match_prefix`` of the same key, with no node made or deleted in between, replays that
  match walk (``_last_walk``) instead of walking again.
- The walks try a node's split-chain child (``_next``) before its children dict.
- A split makes no tensors: a node's ``value`` view of its run's tensor is made when read. A leaf's ``children`` is
  the shared read-only ``NO_CHILDREN`` until its first child.

Each test runs the same operations on two trees, one of which never gets to replay a walk, and compares every
node's fields (access and creation times, hit counts, priorities, locks, values), the counters and the victims.
"""

from __future__ import annotations

import random
from array import array

import pytest
import torch

from kvlab.errors import InvariantError
from kvlab.mem_cache import RadixCache
from kvlab.mem_cache.radix_cache import NO_CHILDREN


def snapshot(cache: RadixCache):
    nodes = sorted(cache.nodes(), key=lambda n: n.id)
    return (cache.clock.now, cache.structure_version, cache.evictable_size(), cache.protected_size(),
            [(n.id, n.key.tolist(), n.last_access_time, n.creation_time, n.hit_count, n.priority, n.lock_ref,
              n.value.tolist(), None if n.parent is None else n.parent.id) for n in nodes])


class Twins:
    """The same operations on a tree (``fast``) and on one whose insert never replays a match walk (``plain``)."""

    def __init__(self, page_size: int, policy: str = "lru"):
        self.fast = RadixCache(page_size=page_size, eviction_policy=policy)
        self.plain = RadixCache(page_size=page_size, eviction_policy=policy)
        self.next_slot = 1
        self.replayed = 0
        self.locks: list = []

    def match(self, key):
        a, b = self.fast.match_prefix(key), self.plain.match_prefix(key)
        assert (a.device_prefix_len, a.device_indices.tolist()) == (b.device_prefix_len, b.device_indices.tolist())
        return a, b

    def insert(self, key, priority=0, inserted_len=0):
        last = self.fast._last_walk
        if (last is not None and last[2] == self.fast.structure_version
                and array("q", key).tobytes()[: len(last[0])] == last[0]):
            self.replayed += 1
        value = torch.arange(self.next_slot, self.next_slot + len(key), dtype=torch.int64)
        self.next_slot += len(key)
        self.plain._last_walk = None
        got = (self.fast.insert(key, value, priority, inserted_len), self.plain.insert(key, value, priority,
                                                                                       inserted_len))
        assert got[0] == got[1]

    def lock(self, key):
        a, b = self.match(key)
        if a.device_prefix_len:
            self.fast.inc_lock_ref(a.last_device_node)
            self.plain.inc_lock_ref(b.last_device_node)
            self.locks.append((a.last_device_node, b.last_device_node))

    def unlock(self, i):
        a, b = self.locks.pop(i)
        self.fast.dec_lock_ref(a)
        self.plain.dec_lock_ref(b)

    def evict(self, k):
        a, b = self.fast.evict(k), self.plain.evict(k)
        assert a == b

    def check(self):
        self.fast.check_invariants()
        self.plain.check_invariants()
        assert snapshot(self.fast) == snapshot(self.plain)


def family(rng: random.Random, page_size: int):
    """Keys sharing a few long prefixes cut at random points (deep chains of split nodes, as in
    bench_radix_cache.py), some ending inside a page."""
    prefixes = [[rng.randrange(1, 50) for _ in range(40)] for _ in range(3)]

    def key():
        p = rng.choice(prefixes)
        return p[: rng.randrange(1, 41)] + [rng.randrange(1, 50) for _ in range(rng.randrange(0, 6 * page_size))]

    return key


@pytest.mark.parametrize("page_size,policy", [(1, "lru"), (1, "lfu"), (4, "priority"), (2, "fifo")])
def test_insert_after_a_match_of_the_same_key_equals_a_fresh_walk(page_size, policy):
    rng = random.Random(page_size * 31 + len(policy))
    t = Twins(page_size, policy)
    key = family(rng, page_size)
    for _ in range(300):
        k = key()
        op = rng.random()
        if op < 0.45:  # the replayable pattern: match then insert the same key, maybe locked in between
            t.match(k)
            if rng.random() < 0.3:
                t.lock(k)
            t.insert(k, priority=rng.randrange(3), inserted_len=rng.choice([0, 0, len(k) // 2]))
        elif op < 0.6:  # a match, then an eviction (the structure changes), then the insert
            t.match(k)
            t.evict(rng.randrange(1, 30))
            t.insert(k)
        elif op < 0.7:  # a match of one key, an insert of another
            t.match(k)
            t.insert(key())
        elif op < 0.8:  # the same tokens, the key one page longer or shorter than the match's, or its last changed
            t.match(k)
            r = rng.random()
            t.insert(k + [7] * page_size if r < 0.33 else k[:-page_size] if r < 0.66 else k[:-1] + [k[-1] % 49 + 1])
        elif op < 0.9 and t.locks:
            t.unlock(rng.randrange(len(t.locks)))
        else:
            t.insert(k)
        t.check()
    while t.locks:
        t.unlock(0)
    t.evict(10**9)  # every victim, in order, on both trees
    t.check()
    assert t.fast.total_size() == 0
    assert len(NO_CHILDREN) == 0  # no leaf wrote into the shared mapping
    assert t.replayed > 60  # the shortcut was taken, and often


def test_a_key_array_changed_in_place_after_the_match_is_walked_again():
    t = Twins(1)
    t.insert([1, 2, 3, 4, 5, 6])
    key = array("q", [1, 2, 3, 9, 9, 9])
    t.match(key)
    key[1] = 8  # same array object, same length, other tokens: the match walk no longer applies
    t.insert(key)
    t.check()
    assert [n.key.tolist() for n in t.fast.root_node.children[1].children.values()] == [[2, 3], [8, 3, 9, 9, 9]]


def test_split_chain_pointers_follow_splits_and_evictions():
    cache = RadixCache()
    cache.insert(list(range(1, 21)), torch.arange(100, 120))
    for cut in (15, 5, 10):  # three matches ending inside the chain: four pieces of one value tensor
        assert cache.match_prefix(list(range(1, cut + 1)) + [99]).device_prefix_len == cut
        cache.check_invariants()
    chain, node = [], cache.root_node.children[1]
    while node is not None:
        chain.append(node.key.tolist())
        node = node._next
    assert chain == [list(range(1, 6)), list(range(6, 11)), list(range(11, 16)), list(range(16, 21))]
    cache.insert([1, 2, 3, 50, 51], torch.arange(200, 205))  # a sibling off the chain: not its _next
    cache.check_invariants()
    cache.evict(5)  # the oldest leaf is the chain's last piece: its parent's _next is cleared
    cache.check_invariants()
    assert cache.match_prefix(list(range(1, 21))).device_indices.tolist() == list(range(100, 115))
    cache.root_node.children[1]._next = None  # a walk would then miss the chain: check_invariants says so
    with pytest.raises(InvariantError, match="_next"):
        cache.check_invariants()


def test_split_halves_read_their_slots_as_views_of_one_tensor():
    cache = RadixCache()
    slots = torch.arange(100, 110)
    cache.insert(list(range(1, 11)), slots)
    leaf = cache.root_node.children[1]
    assert leaf.children is NO_CHILDREN
    with pytest.raises(TypeError):
        leaf.children[5] = leaf  # read-only: a bug cannot give every leaf a child
    cache.match_prefix([1, 2, 3, 4, 99])  # splits the leaf after 4 tokens
    upper = cache.root_node.children[1]
    lower = upper.children[5]
    assert (upper.value.tolist(), lower.value.tolist()) == (list(range(100, 104)), list(range(104, 110)))
    assert upper.value.dtype == lower.value.dtype == torch.int64
    assert lower.value.data_ptr() == upper.value.data_ptr() + 4 * 8  # one tensor, not copies
    assert upper.value is upper.value  # made once, then cached
    cache.insert([1, 2, 3, 4, 5, 6, 50], torch.arange(200, 207))  # splits the lower half again, adds a sibling
    cache.check_invariants()
    assert lower.value.tolist() == list(range(106, 110)) and not lower.evicted
    cache.evict(4)  # the oldest leaf: `lower`
    assert lower.evicted and lower.value is None
    cache.check_invariants()
