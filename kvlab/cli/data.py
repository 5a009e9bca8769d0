"""``kvlab data``: regenerate the files kvlab ships in ``data/``."""

from __future__ import annotations

from kvlab.argtypes import int_at_least as _int_at_least
from kvlab.errors import fail


def add_parser(commands, command: str | None) -> None:
    """``kvlab data tiny-checkpoint``'s options."""
    data = commands.add_parser("data", help="regenerate the files kvlab ships in data/")
    data_kinds = data.add_subparsers(dest="kind", required=True)
    tiny = data_kinds.add_parser("tiny-checkpoint", help="write the tiny model's safetensors checkpoint")
    tiny.add_argument("--out", default="data/tiny-llama", help="output directory (default: %(default)s)")
    # torch's generator takes seeds in [-2^63, 2^64 - 1] (kvlab.model.checkpoint.MIN_SEED/MAX_SEED; issue 37: 10^20
    # was "Overflow when unpacking long long")
    tiny.add_argument("--seed", type=_int_at_least(-(2 ** 63), 2 ** 64 - 1), default=0,
                      help="weights seed, an integer from -2^63 to 2^64 - 1 (default: %(default)s)")
    tiny.add_argument("--force", action="store_true", help="overwrite an existing checkpoint")


def run(args) -> int:
    from pathlib import Path

    from kvlab.model import get_model_config, write_checkpoint
    from kvlab.model.checkpoint import SAFETENSORS_FILE

    target = Path(args.out) / SAFETENSORS_FILE
    if target.exists() and not args.force:
        return fail(f"{target} exists; pass --force to overwrite it")
    path = write_checkpoint(args.out, get_model_config("tiny"), seed=args.seed)
    print(f"wrote {path} ({path.stat().st_size:,} bytes)")
    return 0
