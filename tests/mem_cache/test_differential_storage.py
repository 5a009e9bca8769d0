"""Differential test: kvlab's storage tier (``kvlab.mem_cache.hicache.storage``) against SGLang 0.5.23's own classes.

``tests/reference/sglang_storage_driver.py`` runs inside the 0.5.23 reference venv: ``get_hash_str`` (the wheel's
native SHA-256 page chain, compiled on first use) and ``HiCacheFile`` (with its LRU file evictor) on a temporary
directory. The same seeded scripts run here through :func:`get_hash_str` and :class:`HiCacheStorage`, and every
answer must be equal: page keys, which keys exist after each op (set, get, backup of a token run), ``batch_exists``,
what a prefetch's hit query of a prefix finds, and what a bounded store evicts or refuses.

SGLang's ``HiCacheController`` threads and ``HiRadixCache``'s prefetch flows cannot run here (docs/testing.md):
they are re-expressed as kvlab tests in ``tests/mem_cache/test_hicache_storage.py``.
"""

from __future__ import annotations

import json
import random
import subprocess
from pathlib import Path

import pytest

from kvlab.mem_cache.hicache.storage import HiCacheStorage, get_hash_str

from .test_differential_sglang import require_reference

DRIVER = Path(__file__).resolve().parents[2] / "tests" / "reference" / "sglang_storage_driver.py"
pytestmark = pytest.mark.slow


def hash_cases() -> list:
    rng = random.Random(7)
    cases = [[[], None, 4], [[1, 2, 3, 4, 5, 6, 7, 8], None, 4], [[0, 2**32 - 1, 5], None, None], [[9] * 5, None, 1],
             [[1, 2, 2**32, 3, 4, 5], None, 2], [[2**40, 7], None, None]]  # wide pages: ids past uint32
    for _ in range(20):
        tokens = [rng.randrange(0, 2**32) for _ in range(rng.randrange(1, 40))]
        prior = get_hash_str([rng.randrange(100)]) if rng.random() < 0.5 else None
        cases.append([tokens, prior, rng.choice([None, 1, 3, 16])])
    return cases


def file_script(seed: int, max_pages: int | None) -> dict:
    """Ops on one store: single keys, and backups / hit queries of token runs sharing prefixes (as a conversation's
    turns do), so queries find partial prefixes and a bounded store evicts."""
    rng = random.Random(seed)
    page_bytes, ps = 64, 4
    base = [rng.randrange(1000) for _ in range(32)]
    runs = [base[: rng.randrange(1, 9) * ps] + [rng.randrange(1000) for _ in range(rng.randrange(0, 3) * ps)]
            for _ in range(8)]
    keys = [f"k{i}" for i in range(8)]
    ops = []
    for _ in range(60):
        kind = rng.random()
        if kind < 0.3:
            ops.append(["backup", rng.choice(runs), None, ps])
        elif kind < 0.5:
            ops.append(["query", rng.choice(runs), None, ps])
        else:
            name = rng.choice(["set", "set", "get", "exists", "batch_exists"])
            ops.append([name, rng.sample(keys, 3) if name == "batch_exists" else rng.choice(keys)])
    return {"page_bytes": page_bytes, "max_size": (max_pages or 0) * page_bytes + (rng.randrange(page_bytes) if max_pages else 0),
            "ops": ops}


def run_kvlab_file(script: dict) -> list[dict]:
    store = HiCacheStorage(script["page_bytes"], script["max_size"] or None)
    known = sorted({a for name, *args in script["ops"] if name in ("set", "get", "exists", "batch_exists")
                    for arg in args for a in (arg if isinstance(arg, list) else [arg])})
    records = []
    for name, *args in script["ops"]:
        if name in ("backup", "query"):
            keys = get_hash_str(args[0], args[1], args[2])
            result = store.batch_set(keys) == len(keys) if name == "backup" else store.batch_exists(keys)
            if name == "backup":
                known.extend(k for k in keys if k not in known)
        elif name == "batch_exists":
            result = store.batch_exists(args[0])
        else:
            result = getattr(store, name)(args[0])
        store.check_invariants()
        records.append({"op": name, "result": result, "stored": sorted(k for k in known if store.exists(k))})
    return records


SCRIPTS = [file_script(seed, cap) for seed in range(4) for cap in (None, 3, 7)]


@pytest.fixture(scope="module")
def reference():
    py = require_reference("0.5.23")
    payload = json.dumps({"hashes": hash_cases(), "file": SCRIPTS})
    out = subprocess.run([str(py), str(DRIVER)], input=payload, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    return json.loads(out.stdout)


def test_page_keys_equal_sglangs_get_hash_str(reference):
    assert reference["version"] == "0.5.23"
    mine = [get_hash_str(tokens, prior, ps) for tokens, prior, ps in hash_cases()]
    assert mine == reference["hashes"]


@pytest.mark.parametrize("index", range(len(SCRIPTS)))
def test_store_equals_hicache_file_op_for_op(reference, index):
    mine, theirs = run_kvlab_file(SCRIPTS[index]), reference["file"][index]
    for i, (a, b) in enumerate(zip(mine, theirs)):
        assert a == b, f"op {i} {SCRIPTS[index]['ops'][i][0]}: kvlab {a} != HiCacheFile {b}"
    assert len(mine) == len(theirs)


def test_the_scripts_exercise_what_they_compare():
    """A bounded script evicts and a query finds a partial prefix, so the comparison above covers both."""
    evicted = partial = 0
    for script in SCRIPTS:
        store = HiCacheStorage(script["page_bytes"], script["max_size"] or None)
        for name, *args in script["ops"]:
            if name == "backup":
                store.batch_set(get_hash_str(args[0], args[1], args[2]))
            elif name == "query":
                keys = get_hash_str(args[0], args[1], args[2])
                partial += 0 < store.batch_exists(keys) < len(keys)
        evicted += store.evicted_pages
    assert evicted > 0 and partial > 0
