"""Validate kvlab on a real CUDA GPU in a few minutes and write the results as JSON.

    python benchmarks/gpu_validation.py --out gpu_validation.json

1. The allocator model against torch.cuda: every script of ``kvlab.device.alloc_scripts`` replayed on
   ``CudaDevice`` and on a ``SimulatedGPU`` shaped like this GPU; allocated/reserved bytes must be equal after
   every step (the logic of tests/gpu/test_cuda_vs_model.py), and the allocator event streams (torch's
   ``_record_memory_history`` trace vs the model's recorder; action and size, addresses differ) equal.
2. Finding 1 at real scale on this GPU: ``kv_pool_sizing.compare(preset, device="cuda")`` — the path of
   ``kvlab repro kv-pool-sizing --device cuda`` — so the loader's cycle-held temporaries really sit in
   torch's caching allocator and the pool size comes from real ``torch.cuda.mem_get_info`` readings,
   with and without ``gc.collect()`` before measuring.

Without CUDA it exits with a message and status 2 (nothing to validate; not a pass).
"""

from __future__ import annotations

import argparse
import gc
import json
import platform
import sys
import time
from pathlib import Path

NO_CUDA_EXIT = 2
# Presets that fit one GPU: the PR's 4×H200 scenario needs 4 devices, so on one GPU the L4-sized scenario
# (an 8B model on a 24 GB budget) is the real-scale check; the 4-GPU one runs when 4 are visible.
SINGLE_GPU_PRESET = "llama-8b-l4"
MULTI_GPU_PRESET = "sglang-pr-4xh200"


def _model_like_this_gpu():
    from kvlab.device import get_device
    from kvlab.device.spec import DeviceSpec

    cuda = get_device("cuda")
    free, total = cuda.mem_get_info()
    spec = DeviceSpec("this-gpu", total, context_bytes=total - free - cuda.memory_reserved())
    return cuda, get_device("sim:this-gpu", spec=spec)


def _trace_steps(snapshot: dict) -> list[tuple[str, int]]:
    """(action, size) of each trace event of device 0, the comparable part of an event stream."""
    from kvlab.device.snapshot import read_snapshot

    frame = read_snapshot(snapshot).events_frame()
    frame = frame[frame["device"] == 0]
    return list(zip(frame["action"].tolist(), frame["size"].astype(int).tolist()))


def validate_allocator() -> dict:
    import torch

    from kvlab.device.alloc_scripts import ALLOCATION_SCRIPTS, replay

    results = {}
    for name, script in sorted(ALLOCATION_SCRIPTS.items()):
        gc.collect()
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        cuda, model = _model_like_this_gpu()
        base_alloc, base_res = cuda.memory_allocated(), cuda.memory_reserved()
        torch.cuda.memory._record_memory_history(max_entries=100_000)
        try:
            real = [(a - base_alloc, r - base_res) for a, r in replay(cuda, script)]
            real_events = _trace_steps(torch.cuda.memory._snapshot())
        finally:
            torch.cuda.memory._record_memory_history(enabled=None)
        modelled = replay(model, script)
        model_events = _trace_steps(model.snapshot())
        mismatched = [i for i, (r, m) in enumerate(zip(real, modelled), 1) if r != m]
        first_event_diff = next((i for i, (r, m) in enumerate(zip(real_events, model_events)) if r != m), None)
        results[name] = {
            "steps": len(script),
            "bytes_equal": real == modelled,
            "first_mismatched_step": mismatched[0] if mismatched else None,
            "torch": real, "model": modelled,
            "events_equal": real_events == model_events,
            "torch_events": len(real_events), "model_events": len(model_events),
            "first_event_difference": None if first_event_diff is None else {
                "index": first_event_diff, "torch": real_events[first_event_diff],
                "model": model_events[first_event_diff]},
        }
    return results


def validate_finding1(preset: str) -> dict:
    from kvlab.experiments import kv_pool_sizing

    start = time.perf_counter()
    no_gc, with_gc = kv_pool_sizing.compare(preset, device="cuda")
    held_bytes = sum(w.kept_staging_bytes for w in no_gc.weights)
    recovered_bytes = with_gc.reading.free_bytes - no_gc.reading.free_bytes
    return {
        "preset": preset,
        "seconds": round(time.perf_counter() - start, 2),
        "without_gc": no_gc.to_json(),
        "with_gc": with_gc.to_json(),
        "cycle_held_temporaries_bytes": held_bytes,
        "free_bytes_recovered_by_gc": recovered_bytes,
        # the finding holds when gc gives back (nearly) all the cycle-held bytes and the pool grows
        "reproduced": recovered_bytes >= 0.95 * held_bytes and with_gc.max_total_num_tokens > no_gc.max_total_num_tokens,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="gpu_validation.json", help="JSON file to write (default: %(default)s)")
    parser.add_argument("--preset", default=None,
                        help=f"finding-1 scenario (default: {MULTI_GPU_PRESET} with 4 GPUs, else {SINGLE_GPU_PRESET})")
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        print("gpu_validation: no CUDA device (torch.cuda.is_available() is False): nothing to validate. "
              "Run this on a machine with an NVIDIA GPU and a CUDA build of torch.", file=sys.stderr)
        return NO_CUDA_EXIT
    start = time.perf_counter()
    preset = args.preset or (MULTI_GPU_PRESET if torch.cuda.device_count() >= 4 else SINGLE_GPU_PRESET)
    results = {
        "gpu": torch.cuda.get_device_name(0), "gpus": torch.cuda.device_count(), "torch": torch.__version__,
        "cuda": torch.version.cuda, "python": platform.python_version(),
        "allocator": validate_allocator(),
    }
    results["finding1"] = validate_finding1(preset)
    results["seconds"] = round(time.perf_counter() - start, 2)
    alloc_ok = all(r["bytes_equal"] and r["events_equal"] for r in results["allocator"].values())
    results["ok"] = alloc_ok and results["finding1"]["reproduced"]
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    for name, r in results["allocator"].items():
        print(f"allocator {name:<22} bytes {'equal' if r['bytes_equal'] else 'DIFFER'}  "
              f"events {'equal' if r['events_equal'] else 'DIFFER'} ({r['torch_events']} vs {r['model_events']})")
    f1 = results["finding1"]
    print(f"finding 1 ({preset}, cuda): max_total_num_tokens {f1['without_gc']['max_total_num_tokens']:,} without gc "
          f"-> {f1['with_gc']['max_total_num_tokens']:,} with gc; reproduced={f1['reproduced']}")
    print(f"wrote {args.out} in {results['seconds']:.0f} s; ok={results['ok']}")
    return 0 if results["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
