"""Write the example runtime log notebook 05 opens with: a kvlab simulation printed in SGLang 0.5.23's runtime line
formats (kvlab.serving.runtime.render), so its truth (hit rate, retractions, usage) is known.

    python benchmarks/make_runtime_log.py --out data/examples/runtime_logs/multi-turn-chat-20k-sglang-0.5.23-rendered.log
"""

from __future__ import annotations

import argparse
from pathlib import Path

from kvlab.sched import simulate
from kvlab.serving.runtime.render import render_sglang_runtime
from kvlab.sweep.point import load_requests, scheduler_config

WORKLOAD, SEED, KV_TOKENS = "multi-turn-chat", 0, 20000


def rendered_lines() -> list[str]:
    result = simulate(load_requests(workload=WORKLOAD, seed=SEED), scheduler_config(kv_tokens=KV_TOKENS),
                      progress=False)
    label = f"kvlab simulate --workload {WORKLOAD} --seed {SEED} --kv-tokens {KV_TOKENS}"
    return render_sglang_runtime(result.rows, KV_TOKENS, label=label)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, type=Path)
    args = parser.parse_args()
    args.out.write_text("\n".join(rendered_lines()) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
