"""HiCache's third tier (L3): a storage backend of page-wise hashed keys, its capacity and its speed.

Upstream (SGLang 0.5.23): ``mem_cache/utils.py::get_hash_str`` (``cpp_utils/hash_binding.cpp``: each page's key is
the SHA-256 of the previous page's digest followed by the page's token ids as little-endian uint32 (or, for a page
with an id past uint32, 0xff and the ids as uint64), so a key names
the page *and* its whole prefix), ``mem_cache/hicache_storage.py::HiCacheStorage`` / ``HiCacheFile``
(``exists``, ``batch_exists``: the number of consecutive keys present from the first; ``set`` of a present key
refreshes its recency and writes nothing; ``get`` refreshes it; ``clear``) and
``mem_cache/storage/file/lru_file_evictor.py::LRUFileEvictor`` (capacity: unbounded unless a ``max_size`` is
given; a new page that would pass the cap first evicts least recently used pages until the store is at most
``eviction_ratio`` (0.9) of the cap less the new page; a page larger than the cap is refused).

Keys are interned (:meth:`HiCacheStorage.page_ids`): a page's key is an integer naming (the previous page's key,
the page's tokens), which is what its SHA-256 hex is a function of; the hex itself is computed only when asked for
(:meth:`HiCacheStorage.hex`, :meth:`HiCacheStorage.keys`), so a run hashes nothing. A store also takes keys as
strings (any name, e.g. the hex keys of another run): it then keeps every key as its hex.

kvlab stores keys only (no bytes), as SGLang's own no-IO simulator does (``mem_cache/storage/sim_storage.py``),
and prices each read and write as ``latency_s + bytes / bandwidth`` on the cache controller's modelled clock
(:mod:`kvlab.mem_cache.hicache.storage_controller`). The backends differ here only in capacity, bandwidth and
latency: :data:`STORAGE_PRESETS`, each with its source and marked as assumed. Every backend evicts as
``HiCacheFile``'s LRU evictor does when bounded (Mooncake's and 3FS's own eviction policies are not modelled).
"""

from __future__ import annotations

import hashlib
import math
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from kvlab.errors import require

_FIRSTS = 1 << 32  # an interned page of consecutive ids: its first id < 2^32
_FILED = object()  # (_tokens_after: this prior's pages of tokens are filed in _ids)
_UNFILED = 4  # pages of tokens after one prior found by comparing tokens, before they are filed by their code
EVICTION_RATIO = 0.9  # LRUFileEvictor's default eviction_ratio (SGLANG_HICACHE_FILE_BACKEND_EVICTION_RATIO)


def page_bytes(tokens: Sequence[int]) -> bytes:
    """A page's bytes as ``hash_binding.cpp`` hashes them: its ids as little-endian uint32, or, when one does not
    fit (a wide page), the byte 0xff then the ids as little-endian uint64."""
    try:
        return array("I", tokens).tobytes()
    except OverflowError:
        return b"\xff" + array("Q", tokens).tobytes()


def page_key(page: Sequence[int] | bytes, prior_hash: str | None = None) -> str:
    """One page's key as :func:`get_hash_str` chains it: the SHA-256 of ``prior_hash``'s digest and the page's bytes
    (``page``: its token ids, or their bytes as ``page_bytes`` lays them out)."""
    data = page if isinstance(page, bytes) else page_bytes(page)
    return hashlib.sha256((bytes.fromhex(prior_hash) if prior_hash else b"") + data).hexdigest()


def get_hash_str(token_ids: Sequence[int], prior_hash: str | None = None, page_size: int | None = None) -> str | list[str]:
    """SGLang's ``get_hash_str``: with ``page_size``, one hex key per page (the last page may be partial), each
    the SHA-256 of the previous one's digest (the first: ``prior_hash``'s) and the page's bytes; without, one key for
    all of ``token_ids``. Ids are non-negative int64 (a negative one raises, as SGLang's)."""
    digest = bytes.fromhex(prior_hash) if prior_hash else b""
    if page_size is None:
        return hashlib.sha256(digest + page_bytes(token_ids)).hexdigest()
    if page_size < 1:
        raise ValueError(f"get_hash_str: page_size must be positive, got {page_size}")
    keys = []
    for start in range(0, len(token_ids), page_size):
        digest = hashlib.sha256(digest + page_bytes(token_ids[start : start + page_size])).digest()
        keys.append(digest.hex())
    return keys


@dataclass(frozen=True)
class StoragePreset:
    """A backend as kvlab models it: ``capacity_gb`` (decimal GB per rank, None: unbounded), read and write
    bandwidth (GB/s per rank) and a per-operation latency (µs). ``source``: where the figures come from; every
    preset is an assumption, not a measurement of a given installation."""

    name: str
    capacity_gb: float | None
    read_gbps: float
    write_gbps: float
    latency_us: float
    source: str
    assumed: bool = True


STORAGE_PRESETS: dict[str, StoragePreset] = {p.name: p for p in (
    StoragePreset("file", None, 5.0, 5.0, 100.0,
                  "HiCacheFile is unbounded unless max_size is set (storage/file/lru_file_evictor.py); speed: "
                  "SGLang's storage simulator defaults (storage/sim_storage.py: sim_write_gbps 5.0, read = write, "
                  "sim_op_latency_us 100), a local NVMe SSD"),
    StoragePreset("mooncake", 4.0, 20.0, 20.0, 50.0,
                  "capacity: MOONCAKE_GLOBAL_SEGMENT_SIZE's default 4gb per rank (srt/environ.py); speed: assumed "
                  "for one 200 Gb/s RDMA NIC per rank (about 20 GB/s usable), 50 µs per batch"),
    StoragePreset("hf3fs", 1024.0, 10.0, 10.0, 200.0,
                  "capacity: the 3FS backend's default file_size 1 << 40 bytes (storage/hf3fs/storage_hf3fs.py); "
                  "speed: assumed, a 3FS client over a 100 Gb/s NIC (about 10 GB/s), 200 µs per batch"),
    StoragePreset("nixl", None, 5.0, 5.0, 100.0,
                  "NIXL's file plugin writes one file per key and evicts nothing (storage/nixl/hicache_nixl.py); "
                  "speed: assumed equal to the file backend's"),
)}
STORAGE_BACKENDS = tuple(STORAGE_PRESETS)
PREFETCH_POLICIES = ("best_effort", "wait_complete", "timeout")  # --hicache-storage-prefetch-policy


class RecencyLog:
    """An unbounded store's keys, least recently used first, refreshed in bulk at C speed: a set of the keys and
    a log of every store and refresh in order, where a key's place is its last entry (the log is compacted to one
    entry per key, in that order, when read or when it grows past twice the keys). The same order as a dict whose
    refreshed key is taken out and put back at the end."""

    __slots__ = ("_keys", "_log")

    def __init__(self, keys: Sequence = ()):
        self._keys: set = set()
        self._log: list = []
        self.extend(keys)

    def __contains__(self, key) -> bool:
        return key in self._keys

    def __len__(self) -> int:
        return len(self._keys)

    def __iter__(self):
        self._compact()
        return iter(self._log)

    def extend(self, keys: Sequence) -> None:
        """Store or refresh ``keys`` in order: each becomes the most recently used (the last one most)."""
        self._keys.update(keys)
        log = self._log
        log.extend(keys)
        if len(log) > 2 * len(self._keys) + 64:
            self._compact()

    def __setitem__(self, key, _value: None) -> None:
        self.extend((key,))

    def move_to_end(self, key) -> None:
        self.extend((key,))

    def clear(self) -> None:
        self._keys.clear()
        self._log.clear()

    def _compact(self) -> None:
        """One entry per key, at its last place in the log."""
        log = self._log
        if len(log) > len(self._keys):
            log.reverse()
            log[:] = dict.fromkeys(log)
            log.reverse()

    def check_invariants(self) -> None:
        require(self._keys.issubset(self._log) and len(set(self._log)) == len(self._keys),
                "RecencyLog: the log holds exactly the stored keys", keys=len(self._keys), log=len(self._log))


class HiCacheStorage:
    """The keys an L3 backend holds, with ``HiCacheFile``'s capacity rule (its LRU evictor).

    ``page_bytes``: bytes of one page's KV (``page_size * size_per_token``); ``capacity_bytes``: None (or 0) for an
    unbounded store. It outlives the trees that use it: ``/flush_cache`` clears the device and host tiers, not this
    (:meth:`clear` is ``clear_storage_backend``'s)."""

    def __init__(self, page_bytes: int, capacity_bytes: int | None = None, eviction_ratio: float = EVICTION_RATIO):
        if page_bytes < 1:
            raise ValueError(f"HiCacheStorage: page_bytes must be positive, got {page_bytes}")
        if capacity_bytes is not None and capacity_bytes < 0:
            raise ValueError(f"HiCacheStorage: capacity_bytes must be >= 0 (0 or None: unbounded), got {capacity_bytes}")
        self.page_bytes = page_bytes
        self.capacity_bytes = capacity_bytes or None
        self.eviction_ratio = eviction_ratio
        # the stored keys, least recently used first: a bounded store's an OrderedDict (key -> None), an unbounded
        # one's (it evicts nothing: only ``keys`` reads the order) a RecencyLog, refreshed in bulk
        self._lru: OrderedDict[int | str, None] | RecencyLog = (
            OrderedDict() if self.capacity_bytes is not None else RecencyLog())
        self.evicted_pages = 0
        self.refused_pages = 0
        # keys are 0, 1, ...: key -> the key before it (``_heads``: the keys whose prior is not key - 1, -1: none;
        # every page of a chain made at once but its first has key - 1) and, for a page of ``_run_len`` (the first
        # page's length) consecutive ids in [0, 2^32), its first id (any other page: -1, its tokens in ``_pages``).
        # A run page whose key is its prior's + 1 is found by these two alone; ``_ids`` holds the others by their
        # code: after the key ``prior``, a run page from ``first`` is the int (prior + 1) * 2^32 + first, any other
        # page (prior, the tuple of its tokens), filed only past the first few after its prior (``_tokens_key``)
        self._heads: dict[int, int] = {}
        self._first = array("q")
        self._pages: dict[int, tuple] = {}
        self._tokens_after: dict[int, list | object] = {}  # prior -> keys of pages of tokens after it (_tokens_key)
        self._ids: dict[int | tuple, int] = {}
        self._run_len: int | None = None
        self._digests: dict[int, bytes] = {}  # key -> its SHA-256 digest, once asked for
        self._named = False  # a key was given as a string: every key is kept as its hex from then on

    @property
    def bounded(self) -> bool:
        return self.capacity_bytes is not None

    def used_bytes(self) -> int:
        return len(self._lru) * self.page_bytes

    def __len__(self) -> int:
        return len(self._lru)

    def keys(self) -> list[str]:
        """The stored keys (their hex), least recently used first."""
        return [self.hex(k) if type(k) is int else k for k in self._lru]

    # -- interned keys -------------------------------------------------------------------------------
    def page_ids(self, token_ids: Sequence[int], prior: int | None = None, page_size: int = 1,
                 known: bool = False) -> list[int]:
        """The interned keys of ``token_ids``' pages (the last may be partial) chained from the key ``prior``:
        :func:`get_hash_str`'s chain, unhashed (:meth:`hex` gives each one's hex). ``known``: as :meth:`chain`'s."""
        out = []
        for start in range(0, len(token_ids), page_size):
            page = tuple(token_ids[start : start + page_size])
            first, n = page[0], len(page)
            ranged = page[-1] - first == n - 1 and page == tuple(range(first, first + n))
            key = self.chain(n, lambda _, page=page: page, (first if ranged else -1,), prior, known)
            if not key:
                break
            prior = key[0]
            out.append(prior)
        return out

    def chain(self, n: int, page_of, firsts: Sequence[int], prior: int | None, known: bool = False) -> list[int]:
        """The keys of pages of ``n`` tokens each, chained from the key ``prior``: a page of consecutive ids is
        given by its first (>= 0), any other by -1 and ``page_of(first)``, the tuple of its tokens. ``known`` (a
        storage query): the keys up to the first page of consecutive ids this store has not interned, which no
        store of interned keys holds, and so neither does any page after it (the query needs no more; a store
        that was given keys as strings interns them all, as without ``known``). The page length and ``page_of``
        come first, so a tree binds them once (``functools.partial``, positional: no Python frame per call)."""
        p = -1 if prior is None else prior
        if n != self._run_len:  # (the first chain sets the run length: None until then)
            if self._run_len is not None:
                return self._chain_pages(firsts, p, n, page_of)
            self._run_len = n
        heads, first_of, out = self._heads, self._first, []
        count = len(first_of)
        for first in firsts:  # (a page checked to be a run page only where it is read: most queries stop at once)
            k = p + 1
            if k < count and first_of[k] == first and first >= 0 and k not in heads:  # (k's prior: k - 1 = p)
                p = k
            elif first < 0 or first + n > _FIRSTS:  # (not a run page: it and the rest page by page)
                out += self._chain_pages(firsts[len(out) :], p, n, page_of)
                return out
            else:
                key = self._ids.get(k * _FIRSTS + first)
                if key is None:  # new, and so is every page after it (no code has a brand-new key as prior)
                    if known and not self._named:
                        return out
                    rest = firsts[len(out) :]
                    ends = sorted(rest) if len(rest) > 1 else (first,)  # (both ends at once: faster than min, max)
                    if ends[0] < 0 or ends[-1] + n > _FIRSTS:  # (a page that is not a run page after it: by page)
                        out += self._chain_pages(rest, p, n, page_of)
                        return out
                    if k != count:  # (as _new_key: only the first new key may be other than its prior's + 1)
                        self._ids[k * _FIRSTS + first] = count
                        heads[count] = p
                    first_of.extend(rest)
                    out.extend(range(count, count + len(rest)))
                    return out
                p = key
            out.append(p)
        return out

    def _chain_pages(self, firsts: Sequence[int], p: int, n: int, page_of) -> list[int]:
        """:meth:`chain` page by page (a page not a run, or of another length than the first's), after ``p``."""
        out, first_of = [], self._first
        for first in firsts:
            if n == self._run_len and 0 <= first and first + n <= _FIRSTS:
                k = p + 1
                if k < len(first_of) and first_of[k] == first and k not in self._heads:
                    key = k
                else:
                    key = self._ids.get(k * _FIRSTS + first)
                    if key is None:
                        key = self._new_key(p, first)
            else:
                page = page_of(first)
                key = self._tokens_key(p, page if type(page) is tuple else tuple(page))
            out.append(key)
            p = key
        return out

    def _tokens_key(self, p: int, page: tuple) -> int:
        """The key of the page of tokens ``page`` after the key ``p``, made if new. The first few such pages after a
        prior are kept unfiled (``_tokens_after``: their keys, found by comparing tokens, which stops at the first
        that differs), more are filed in ``_ids`` by their code: so a page of tokens alone after its prior (most: a
        decode's output) never has its tokens hashed."""
        pages, after = self._pages, self._tokens_after.get(p)
        if after is _FILED:
            key = self._ids.setdefault((p, page), len(self._first))  # (one hash of the page's tokens, not two)
            if key != len(self._first):
                return key
        elif after is None:  # (the first page of tokens after p)
            key = len(self._first)
            self._tokens_after[p] = [key]
        else:
            for key in after:
                if pages[key] == page:
                    return key
            key = len(self._first)
            if len(after) < _UNFILED:
                after.append(key)
            else:  # (many pages of tokens after one prior: filed, hashed once each)
                self._ids.update(((p, pages[k]), k) for k in after)
                self._ids[(p, page)] = key
                self._tokens_after[p] = _FILED
        if key != p + 1:
            self._heads[key] = p
        self._first.append(-1)
        pages[key] = page
        return key

    def _new_key(self, prior: int, first: int) -> int:
        """A new key after ``prior``, a run page from ``first``: ``_ids`` keeps its code unless it is ``prior``'s + 1
        (found without it)."""
        key = len(self._first)
        self._first.append(first)
        if key != prior + 1:
            self._heads[key] = prior
            self._ids[(prior + 1) * _FIRSTS + first] = key
        return key

    def _prior_and_bytes(self, key: int) -> tuple[int, bytes]:
        """The key before ``key`` (-1: none) and ``key``'s page as ``get_hash_str`` hashes it."""
        first, prior = self._first[key], self._heads.get(key, key - 1)
        if first < 0:
            return prior, page_bytes(self._pages[key])
        return prior, array("I", range(first, first + self._run_len)).tobytes()

    def hex(self, key: int) -> str:
        """``key``'s SHA-256 hex, as :func:`get_hash_str` chains it (computed down from the nearest known digest)."""
        digests, chain = self._digests, []
        while key >= 0 and key not in digests:
            chain.append(key)
            key = self._prior_and_bytes(key)[0]
        digest = digests[key] if key >= 0 else b""
        for k in reversed(chain):
            digest = digests[k] = hashlib.sha256(digest + self._prior_and_bytes(k)[1]).digest()
        return digest.hex()

    def hex_keys(self, keys: Sequence[int] | None) -> list[str] | None:
        """:meth:`hex` of each of ``keys`` (a node's ``hash_value``; None stays None)."""
        return None if keys is None else [self.hex(k) for k in keys]

    def _named_keys(self, keys: Sequence[int | str], interned: bool = False) -> list:
        """``keys`` as this store keeps them: interned while no key was given as a string, their hex after
        (``interned``: all of ``keys`` are keys this store interned)."""
        if not self._named:
            if interned or all(type(k) is int for k in keys):
                return keys
            self._named = True  # (a string key: from now on every key is kept as its hex)
            named = [self.hex(k) if type(k) is int else k for k in self._lru]
            self._lru = OrderedDict.fromkeys(named) if self.bounded else RecencyLog(named)
        return [self.hex(k) if type(k) is int else k for k in keys]

    # -- HiCacheFile's operations --------------------------------------------------------------------
    def exists(self, key: int | str) -> bool:
        """Whether ``key`` is stored (recency unchanged, as ``HiCacheFile.exists``)."""
        return self._named_keys((key,))[0] in self._lru

    def batch_exists(self, keys: Sequence[int | str], interned: bool = False) -> int:
        """How many of ``keys`` are stored consecutively from the first (``HiCacheStorage.batch_exists``;
        ``interned``: all of them keys this store interned)."""
        if self._named or not interned:  # (a query of interned keys in a store of them: as they are)
            keys = self._named_keys(keys, interned)
        lru = self._lru
        for i, key in enumerate(keys):
            if key not in lru:
                return i
        return len(keys)

    def get(self, key: int | str) -> bool:
        """Read ``key``: True (and most recently used) if stored, else False."""
        key = self._named_keys((key,))[0]
        if key not in self._lru:
            return False
        self._refresh(key)
        return True

    def _refresh(self, key: int | str) -> None:
        """``key`` (stored) becomes the most recently used."""
        self._lru.move_to_end(key)

    def set(self, key: int | str) -> bool:
        """Store ``key`` (``HiCacheFile.set``): a stored key is refreshed; a new one may first evict LRU keys (a
        bounded store); False when it cannot be admitted."""
        key = self._named_keys((key,))[0]
        lru = self._lru
        if key in lru:
            self._refresh(key)
            return True
        cap, size = self.capacity_bytes, self.page_bytes
        if cap is not None:
            if size > cap:
                self.refused_pages += 1
                return False
            if self.used_bytes() + size > cap:
                target = max(0, int(cap * self.eviction_ratio) - size)
                while lru and self.used_bytes() > target:
                    lru.popitem(last=False)
                    self.evicted_pages += 1
                if self.used_bytes() + size > cap:
                    self.refused_pages += 1
                    return False
        lru[key] = None
        return True

    def batch_set(self, keys: Sequence[int | str], interned: bool = False) -> int:
        """Store ``keys`` in order, stopping at the first refused (``HiCacheFile.batch_set``); returns the number
        stored (``interned``: all of them keys this store interned)."""
        if self._named or not interned:
            keys = self._named_keys(keys, interned)
        if self.capacity_bytes is None:  # (unbounded: each key is refreshed or added, none refused)
            self._lru.extend(keys)
            return len(keys)
        for i, key in enumerate(keys):
            if not self.set(key):
                return i
        return len(keys)

    def clear(self) -> None:
        """Forget every key (``clear_storage_backend``; ``/flush_cache`` does not call it)."""
        self._lru.clear()

    def check_invariants(self) -> None:
        require(len(self._first) >= len(self._ids) and all(-1 <= p < k - 1 for k, p in self._heads.items()),
                "HiCacheStorage: each interned key has its first id and at most one code, a prior before it",
                keys=len(self._first), codes=len(self._ids), heads=len(self._heads))
        require(self.capacity_bytes is None or self.used_bytes() <= self.capacity_bytes,
                "HiCacheStorage: a bounded store holds at most its capacity", used=self.used_bytes(),
                capacity=self.capacity_bytes)
        if not self.bounded:
            self._lru.check_invariants()


def storage_capacity_bytes(backend: str, capacity_gb: float | None) -> int | None:
    """A run's storage capacity in bytes: ``capacity_gb`` when given (0: unbounded), else the preset's."""
    gb = STORAGE_PRESETS[backend].capacity_gb if capacity_gb is None else capacity_gb
    return None if not gb or math.isinf(gb) else int(gb * 10**9)
