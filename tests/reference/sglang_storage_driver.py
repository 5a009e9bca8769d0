"""Drive SGLang's own HiCache storage pieces from a JSON script (runs inside a reference venv, never imported by kvlab).

JSON on stdin: ``{"hashes": [[tokens, prior_hash_or_null, page_size_or_null], ...], "file": [{"page_bytes": int,
"max_size": int (0: unbounded), "ops": [[name, *args], ...]}, ...]}``. Ops on a ``HiCacheFile`` (0.5.23,
``mem_cache/hicache_storage.py`` with its ``storage/file/lru_file_evictor.py``) in a fresh temporary directory:
``["set", key]`` (a page of ``page_bytes`` bytes), ``["get", key]``, ``["exists", key]``, ``["batch_exists",
[keys]]``, ``["backup", tokens, prior, page_size]`` (``get_hash_str`` of the tokens, ``batch_set``),
``["query", tokens, prior, page_size]`` (``get_hash_str``, ``batch_exists``: a prefetch's hit query). JSON on stdout: ``{"version", "hashes": [get_hash_str(...) ...], "file": [[{"op", "result", "stored":
[keys present, sorted]} ...] ...]}``. kvlab's side is ``tests/mem_cache/test_differential_storage.py``.
"""

from __future__ import annotations

import json
import logging
import sys
import tempfile


def run_file(script: dict, known: list[str]) -> list[dict]:
    import torch
    from sglang.srt.mem_cache.hicache_storage import HiCacheFile, HiCacheStorageConfig
    from sglang.srt.mem_cache.utils import get_hash_str

    with tempfile.TemporaryDirectory() as tmp:
        extra = {"file_storage_path": tmp}
        if script["max_size"]:
            extra["max_size"] = script["max_size"]
        config = HiCacheStorageConfig(tp_rank=0, tp_size=1, pp_rank=0, pp_size=1, attn_cp_rank=0, attn_cp_size=1,
                                      is_mla_model=False, enable_storage_metrics=False, is_page_first_layout=False,
                                      model_name="kvlab-ref", extra_config=extra)
        store = HiCacheFile(config, file_path=tmp)
        page = script["page_bytes"]
        records = []
        for name, *args in script["ops"]:
            if name == "set":
                result = store.set(args[0], torch.zeros(page, dtype=torch.uint8))
            elif name == "get":
                result = store.get(args[0], torch.empty(page, dtype=torch.uint8)) is not None
            elif name == "exists":
                result = store.exists(args[0])
            elif name == "batch_exists":
                result = store.batch_exists(args[0])
            elif name == "backup":  # _page_backup of a token run: its chained page keys, set in order
                keys = get_hash_str(args[0], args[1], page_size=args[2])
                result = store.batch_set(keys, [torch.zeros(page, dtype=torch.uint8) for _ in keys])
                known.extend(k for k in keys if k not in known)
            elif name == "query":  # _storage_hit_query of a token run: the pages found from the first
                result = store.batch_exists(get_hash_str(args[0], args[1], page_size=args[2]))
            else:
                raise ValueError(f"unknown op {name!r}")
            records.append({"op": name, "result": result, "stored": sorted(k for k in known if store.exists(k))})
        return records


def main() -> None:
    logging.disable(logging.WARNING)  # (HiCacheFile logs a refused or missing key as a warning)
    import sglang
    from sglang.srt.mem_cache.utils import get_hash_str

    script = json.load(sys.stdin)
    hashes = [get_hash_str(tokens, prior, page_size=ps) for tokens, prior, ps in script.get("hashes", [])]
    out = []
    for file_script in script.get("file", []):
        known = sorted({a for name, *args in file_script["ops"] if name in ("set", "get", "exists", "batch_exists")
                        for arg in args for a in (arg if isinstance(arg, list) else [arg])})
        out.append(run_file(file_script, known))
    json.dump({"version": sglang.__version__, "hashes": hashes, "file": out}, sys.stdout)


if __name__ == "__main__":
    main()
