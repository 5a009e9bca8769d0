"""``kvlab replay``: a torch memory snapshot replayed through the allocator model: fidelity and what-ifs."""

from __future__ import annotations

import json
import sys

from kvlab.argtypes import nonnegative_int as _nonnegative_int
from kvlab.errors import fail
from kvlab.safe_text import printable


def add_parser(commands, command: str | None) -> None:
    """``kvlab replay``'s options."""
    replay = commands.add_parser(
        "replay", help="replay a torch memory snapshot through the allocator model: fidelity and what-ifs",
        description="Replay a torch.cuda.memory._dump_snapshot pickle's trace through kvlab's model of the "
                    "caching allocator, report how exactly it reproduces the recording, and what other "
                    "PYTORCH_CUDA_ALLOC_CONF settings would have done with the same allocations.")
    replay.add_argument("snapshot", help="a _dump_snapshot pickle (or a pickled torch.cuda.memory_snapshot() list)")
    replay.add_argument("--device", type=_nonnegative_int, default=None,
                        help="device index (default: the first device with a trace)")
    replay.add_argument("--what-if", action="append", default=None, metavar="KEY=VALUE[,KEY=VALUE]",
                        help="settings to try, one scenario per flag (repeatable): expandable_segments, "
                             "max_split_size_mb, roundup_power2_divisions (default: expandable_segments=True)")
    replay.add_argument("--capacity", default=None, metavar="SIZE",
                        help="also say whether each scenario runs out of memory on a device of SIZE, e.g. 24GiB")
    replay.add_argument("--device-memory", default=None, metavar="SIZE",
                        help="the device's total memory, e.g. 80GiB (torch's totalGlobalMem): with expandable "
                             "segments it sets each segment's address space (default: from a recorded oom, else "
                             "unknown)")
    replay.add_argument("--json", action="store_true", help="print the report as JSON")


def run(args) -> int:
    import warnings

    from kvlab.device.replay.settings import parse_size
    from kvlab.device.replay.whatif import replay_with_what_ifs
    from kvlab.device.snapshot import SnapshotKeyWarning

    sizes = {}
    for flag, value in (("--capacity", args.capacity), ("--device-memory", args.device_memory)):
        try:
            sizes[flag] = None if value is None else parse_size(value)
        except ValueError as exc:
            return fail(f"{flag}: {exc}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SnapshotKeyWarning)
        result, what_ifs = replay_with_what_ifs(args.snapshot, args.device, args.what_if, sizes["--capacity"],
                                                device_memory=sizes["--device-memory"])
    for warning in caught:
        print(f"kvlab: warning: {printable(warning.message, lines=True)}", file=sys.stderr)
    print(json.dumps(result.to_json(what_ifs), indent=2) if args.json else printable(result.text(what_ifs), lines=True))
    return 0
