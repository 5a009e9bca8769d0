"""Hybrid radix caches (notebook 03): the SWA tree's per-pool shortfall, and why over-eviction
(``evict_from_tree_cache(mode="full")``, SGLang <= 0.5.16) costs a Mamba tree more than a plain one.

Requests are driven straight against the caches (``match_alloc_insert``: match -> lock -> evict +
alloc the extend -> insert -> free duplicates -> unlock): the scheduler adds nothing to this comparison.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from kvlab.mem_cache import (
    EVICTION_MODES,
    MambaPool,
    MambaRadixCache,
    RadixCache,
    SWARadixCache,
    SWATokenToKVPoolAllocator,
    TokenToKVPoolAllocator,
    evict_from_tree_cache,
    match_alloc_insert,
)


@dataclass(frozen=True)
class SWAPressureEvent:
    """One allocation under pressure on an SWA tree: what each pool had, lacked, and gave back."""

    need_tokens: int
    full_available: int
    swa_available: int
    full_shortfall: int
    swa_shortfall: int
    full_evicted: int
    swa_evicted: int
    tombstones: int
    pretty_before: str
    pretty_after: str


def swa_walkthrough(full_size: int = 64, swa_size: int = 40, window: int = 4, need: int = 12,
                    seed: int = 0) -> tuple[SWARadixCache, SWAPressureEvent]:
    """Three running requests share a 12-token prefix, each with its own 6-token tail; each
    holds a lock on its leaf. The full lock covers the whole path, the SWA lock only the last
    ``window`` tokens (the leaf). Then ask for ``need`` slots: the smaller SWA pool is short, the
    full pool is not, so the tree frees SWA KV only, by tombstoning the shared prefix (its full
    KV stays: the running requests still read it in their full-attention layers)."""
    rng = random.Random(seed)
    alloc = SWATokenToKVPoolAllocator(full_size, swa_size, page_size=1)
    cache = SWARadixCache(alloc, sliding_window_size=window)
    prefix = [rng.randrange(100) for _ in range(12)]
    seqs = [prefix + [100 + 10 * i + j for j in range(6)] for i in range(3)]
    for seq in seqs:
        match_alloc_insert(cache, seq)
    # (locking after the first insert would SWA-lock the whole 18-token node, and its split copies it)
    locks = [cache.lock(cache.match_prefix(seq).last_device_node) for seq in seqs]
    held = alloc.alloc(alloc.swa_available_size() - 2)  # other requests' decode KV
    before = cache.pretty_print()
    fa, sa = alloc.full_available_size(), alloc.swa_available_size()
    res = evict_from_tree_cache(cache, need)
    ev = SWAPressureEvent(need, fa, sa, res.shortfall_tokens, res.swa_shortfall_tokens, res.evicted_tokens,
                          res.swa_evicted_tokens, sum(n.swa_tombstone for n in cache.nodes()), before,
                          cache.pretty_print())
    cache.check_invariants()
    for lk in locks:
        cache.unlock(lk)
    alloc.free(held)
    cache.check_invariants()
    return cache, ev


def multi_turn_workload(num_sessions: int = 12, turns: int = 6, turn_tokens: int = 24, seed: int = 0) -> list[list[int]]:
    """Seeded multi-turn chat: each request is its session's history plus a new turn; sessions
    interleave at random, so older conversations compete for the pool."""
    rng = random.Random(seed)
    hist = [[rng.randrange(1000) for _ in range(turn_tokens)] for _ in range(num_sessions)]
    left = [turns] * num_sessions
    out = []
    while any(left):
        s = rng.choice([i for i in range(num_sessions) if left[i]])
        hist[s] = hist[s] + [rng.randrange(1000) for _ in range(turn_tokens)]
        out.append(list(hist[s]))
        left[s] -= 1
    return out


@dataclass(frozen=True)
class WorkloadRun:
    """One replay. ``hit_tokens``: prompt tokens served from the tree; ``prefill_tokens``: tokens
    computed; ``evicted_tokens``: KV tokens the tree freed; ``states_lost``: recurrent states freed
    (Mamba only: a lost state cannot be rebuilt without re-prefilling its whole prefix)."""

    cache: str
    mode: str
    requests: int
    prompt_tokens: int
    hit_tokens: int
    prefill_tokens: int
    evicted_tokens: int
    states_lost: int
    failed: int

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0


def run_workload(kind: str, mode: str, seqs: list[list[int]], pool_tokens: int = 400,
                 mamba_states: int = 64, check: bool = False) -> WorkloadRun:
    """Serve ``seqs`` one at a time on a ``"radix"`` or ``"mamba"`` tree, eviction ``mode``
    (``evict_from_tree_cache``), with ``match_alloc_insert``: match ``seq[:-1]`` -> lock -> evict for
    the extend (+ one state slot on Mamba, ``ensure_mamba_capacity``) -> alloc -> insert -> unlock. ``check``: run every
    ``check_invariants()`` after each request."""
    if mode not in EVICTION_MODES:
        raise ValueError(f"run_workload: mode must be one of {EVICTION_MODES}, got {mode!r}")
    alloc = TokenToKVPoolAllocator(pool_tokens)
    if kind == "radix":
        cache = RadixCache(token_to_kv_pool_allocator=alloc)
    elif kind == "mamba":
        cache = MambaRadixCache(alloc, MambaPool(mamba_states))
    else:
        raise ValueError(f"run_workload: kind must be 'radix' or 'mamba', got {kind!r}")
    prompt = hit = prefill = evicted = lost = failed = 0
    for seq in seqs:
        prompt += len(seq)
        r = match_alloc_insert(cache, seq, max_prefix_len=len(seq) - 1, mode=mode)
        evicted += r.evict.evicted_tokens + r.mamba_evict.evicted_tokens
        lost += getattr(r.evict, "mamba_num_evicted", 0) + getattr(r.mamba_evict, "mamba_num_evicted", 0)
        if r.out_cache_loc is None:
            failed += 1
            continue
        hit += r.prefix_len
        prefill += len(seq) - r.prefix_len
        if check:
            cache.check_invariants()
            alloc.check_invariants()
    return WorkloadRun(kind, mode, len(seqs), prompt, hit, prefill, evicted, lost, failed)


def eviction_mode_comparison(seed: int = 0, pool_tokens: int = 1200, mamba_states: int = 16, **workload):
    """Plain radix vs Mamba tree x shortfall vs full eviction on the same seeded multi-turn workload.

    One row per run: the :class:`WorkloadRun` fields, ``hit_rate``, and against the same cache in
    shortfall mode: ``hit_tokens_lost`` and ``extra_prefill_tokens`` (tokens recomputed because
    of over-eviction) and ``extra_prefill_pct``."""
    import pandas as pd

    seqs = multi_turn_workload(seed=seed, **workload)
    rows = []
    for kind, mode in [(k, m) for k in ("radix", "mamba") for m in EVICTION_MODES]:
        run = run_workload(kind, mode, seqs, pool_tokens=pool_tokens, mamba_states=mamba_states)
        rows.append({**run.__dict__, "hit_rate": run.hit_rate})
    df = pd.DataFrame(rows)
    base = df[df["mode"] == "shortfall"].set_index("cache")
    df["hit_tokens_lost"] = [int(base.loc[c, "hit_tokens"] - h) for c, h in zip(df["cache"], df["hit_tokens"])]
    df["extra_prefill_tokens"] = [int(p - base.loc[c, "prefill_tokens"]) for c, p in zip(df["cache"], df["prefill_tokens"])]
    df["extra_prefill_pct"] = [100.0 * x / max(1, base.loc[c, "prefill_tokens"])
                               for c, x in zip(df["cache"], df["extra_prefill_tokens"])]
    return df


def comparison_table(df):
    """:func:`eviction_mode_comparison`'s table for reading: one row per tree and mode, titles in words,
    percentages with two decimals and token counts with separators; per tree the bug's row, then the fix's."""
    import pandas as pd

    from kvlab.experiments.shortfall_eviction import MODE_LABELS, SHOWN

    trees = {"radix": "plain radix tree", "mamba": "Mamba radix tree"}
    df = df.sort_values("mode", key=lambda m: m.map(SHOWN.index), kind="stable").sort_values(
        "cache", key=lambda c: c.map(list(trees).index), kind="stable")  # per tree: the bug, then the fix
    return pd.DataFrame({
        "tree": [trees.get(c, c) for c in df["cache"]],
        "eviction": [MODE_LABELS.get(m, m) for m in df["mode"]],
        "hit rate": [f"{h:.2%}" for h in df["hit_rate"]],
        "prompt tokens from the cache": [f"{int(v):,}" for v in df["hit_tokens"]],
        "prefill tokens computed": [f"{int(v):,}" for v in df["prefill_tokens"]],
        "extra prefill of full eviction": [f"{int(v):,} ({p:.2f} %)" for v, p in zip(df["extra_prefill_tokens"],
                                                                             df["extra_prefill_pct"])],
        "recurrent states lost": [f"{int(v):,}" for v in df["states_lost"]],
    })


# -- the tree of notebook 03's exercise (kvlab.labs.hybrid_caches.resume) --------------------------
def matched_path(cache: MambaRadixCache, key) -> list[tuple[int, bool]]:
    """The edges ``key`` walks in ``cache`` (root down, no tree change): (tokens, has_state)."""
    node, off, out = cache.root_node, 0, []
    key = list(key)
    while off < len(key):
        child = node.children.get(key[off])
        if child is None:
            break
        m = 0
        while m < len(child.key) and off + m < len(key) and child.key[m] == key[off + m]:
            m += 1
        out.append((m, child.mamba_value is not None and m == len(child.key)))
        if m < len(child.key):
            break
        node, off = child, off + m
    return out


def resume_scenario(seed: int = 0) -> tuple[MambaRadixCache, list[list[int]]]:
    """A small Mamba tree with tombstones (states evicted from internal nodes) and split edges,
    plus the queries the exercise asks about."""
    rng = random.Random(seed)
    alloc = TokenToKVPoolAllocator(256)
    cache = MambaRadixCache(alloc, MambaPool(16))
    stem = [rng.randrange(100) for _ in range(8)]
    seqs = [stem + [rng.randrange(100) for _ in range(k)] for k in (4, 6, 9)]
    seqs.append(seqs[1] + [7, 7, 7])
    for seq in seqs:
        match_alloc_insert(cache, seq)
    cache.evict(0, mamba_num=1)  # the oldest state goes: an internal node becomes a tombstone
    queries = [seqs[3] + [1, 2], seqs[1][:11], seqs[0][:10], seqs[2] + [5], stem[:5], [999]]
    return cache, queries


def state_frame(cache: MambaRadixCache):
    """``tree_frame(cache, names="spans")``: one row per node with ``has_state`` (the node holds a
    recurrent state a hit can resume from), ``mamba_slot``, ``state`` (in words: a state, or none — a
    Mamba tombstone) and a readable ``label`` (where the node lies in the sequence, and its state); the
    root has no state by definition."""
    from kvlab.mem_cache.tree_view import SPANS, tree_frame

    return tree_frame(cache, names=SPANS)


STATE_TABLE_COLUMNS = {"id": "node", "parent_id": "parent", "label": "where in the sequence", "tokens": "tokens",
                       "status": "status", "state": "recurrent state", "mamba_slot": "state slot"}


def state_table(cache: MambaRadixCache):
    """:func:`state_frame` for reading: the node, its parent, where it lies, its tokens, lock status,
    whether it holds a recurrent state and in which slot, with column titles in words."""
    frame = state_frame(cache)[list(STATE_TABLE_COLUMNS)].rename(columns=STATE_TABLE_COLUMNS)
    frame["parent"] = frame["parent"].astype("Int64")
    return frame.set_index("node")


def state_eviction(seed: int = 0):
    """:func:`resume_scenario`'s tree, built afresh, after one more state slot is asked for
    (``evict(0, mamba_num=1)``: no KV needed, one state). Returns (cache, the tree's result). A tree of
    its own, so a widget or table of the tree before keeps showing the moment before."""
    cache, _queries = resume_scenario(seed)
    freed = cache.evict(0, mamba_num=1)
    cache.check_invariants()
    return cache, freed
