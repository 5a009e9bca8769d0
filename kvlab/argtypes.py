"""argparse value types shared by kvlab's command lines (``kvlab`` and ``python -m kvlab.experiments.*``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Iterable

#: the largest count any kvlab flag takes (tokens, pages, requests): 2^31 - 1, far above any real pool, and small enough
#: that a value is never an overflow deep inside torch or numpy (which was a traceback, issue 26)
MAX_COUNT = (1 << 31) - 1
#: the largest pool (tokens or pages) or max-running count ``kvlab simulate`` and ``kvlab sweep`` take: 2^26 tokens
#: (about 1.3 GB of simulator state) is far beyond any real pool; 2^27 took 2.6 GB (issue 26: 10^20 was a traceback)
MAX_POOL = 1 << 26
#: the largest pool (tokens or pages) of ``--kv-tokens`` / ``--kv-pages``: 2^40 tokens, the page engine's bound (it holds
#: counts, not tables: an unlimited cache of a real-size trace); the token-level memory's 2^26 is checked after parsing,
#: where the page size is known (``kvlab.sched.config.check_pool``)
MAX_PAGE_POOL = 1_099_511_627_776  # 2^40 (kvlab.units.POW2_40; this row may not import units)


def int_at_least(minimum: int, maximum: int = MAX_COUNT) -> Callable[[str], int]:
    """An argparse ``type``: an integer in [``minimum``, ``maximum``], else a message naming the value given."""
    what = "a positive integer" if minimum == 1 else f"an integer >= {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        if value > maximum:
            raise argparse.ArgumentTypeError(f"expected at most {maximum:,}, got {text.strip()[:40]}")
        return value

    parse.__name__ = f"int>={minimum}"
    return parse


positive_int = int_at_least(1)
nonnegative_int = int_at_least(0)


def port(text: str) -> int:
    """An argparse ``type``: a TCP port, 1 to 65535 (70000 listened elsewhere: issue 26)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text[:40]!r}") from None
    if not 1 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a port number from 1 to 65535, got {text.strip()[:40]}")
    return value


def ip_address(text: str) -> str:
    """An argparse ``type``: an IPv4 or IPv6 address to listen on (``0.0.0.0``: every interface)."""
    import ipaddress

    try:
        return str(ipaddress.ip_address(text.strip()))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an IP address such as 127.0.0.1 or 0.0.0.0, got {text[:60]!r}") from None


def device_name(presets: Iterable[str], *extra: str) -> Callable[[str], str]:
    """An argparse ``type``: a device kvlab can build (``auto``, ``cuda``, ``cuda:N``, ``sim:<preset>`` with a name
    from ``presets``) or one of ``extra``; anything else is refused naming the presets (``💥`` was accepted:
    issue 26). The presets are passed in: argtypes sits below ``kvlab.device`` in the layers."""
    presets = sorted(presets)

    def parse(text: str) -> str:
        name = text.strip()
        if name in ("auto", "cuda", *extra) or (name.startswith("cuda:") and name[5:].isdecimal() and len(name) < 12) \
                or (name.startswith("sim:") and name[4:] in presets):
            return name
        allowed = ", ".join(("auto", *extra, "cuda", "cuda:N"))
        raise argparse.ArgumentTypeError(f"expected {allowed} or sim:<preset> with a preset from "
                                         f"{', '.join(presets)}; got {text[:40]!r}")

    parse.__name__ = "device"
    return parse


def name_list(text: str) -> list[str]:
    """An argparse ``type``: comma-separated names (``01,02``), none of them empty: ``""`` is not "all" and
    ``01,,02`` is not ``01,02`` (both were read silently: issue 26); leave the flag out for its default."""
    items = [item.strip() for item in text.split(",")]
    if not any(items):
        raise argparse.ArgumentTypeError(f"expected comma-separated names, e.g. 01,02, got {text[:40]!r} (leave the "
                                         "flag out for its default)")
    if not all(items):
        raise argparse.ArgumentTypeError(f"an empty item in {text[:60]!r}; expected comma-separated names, e.g. 01,02")
    return items
