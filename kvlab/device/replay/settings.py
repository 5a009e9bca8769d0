"""Allocator settings for a replay: the ones a snapshot recorded, the ones a ``--what-if`` asks for, and sizes.

:func:`recorded_settings` turns a snapshot's ``allocator_settings`` into the model's
:class:`~kvlab.device.caching_allocator.AllocatorConfig` (torch's defaults, said so, when there are none);
:func:`parse_what_if` reads ``KEY=VALUE[,KEY=VALUE]`` over a base config; :func:`parse_size` reads ``24GiB``.
The first step of the replay's one-way flow (settings, seed → engine → report, what-ifs on top): it imports
nothing else of the replay, nor :mod:`kvlab.device.snapshot` (which calls :func:`recorded_settings`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from kvlab.device.caching_allocator import AllocatorConfig
from kvlab.errors import KvlabError
from kvlab.units import GB, KB, MB, TB, GiB, KiB, MiB, TiB


class SettingsError(KvlabError, ValueError):
    """A snapshot's ``allocator_settings`` the model cannot take; the message names the source and the value."""


_UNITS = {"": 1, "b": 1, "k": KiB, "kib": KiB, "kb": KB, "m": MiB, "mib": MiB, "mb": MB, "g": GiB,
          "gib": GiB, "gb": GB, "t": TiB, "tib": TiB, "tb": TB}
_TRUE, _FALSE = {"true", "1", "yes", "on"}, {"false", "0", "no", "off"}
MAX_SIZE_BYTES = 1 << 50  # 1 PiB: far above any device, far below where byte counts overflow
WHAT_IF_KEYS = ("expandable_segments", "max_split_size_mb", "roundup_power2_divisions")


def parse_size(text: str) -> int:
    """``24GiB``, ``24 GB`` (10^9), ``512MiB``, ``25769803776``: bytes as an int."""
    match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", str(text))
    unit = match.group(2).lower() if match else None
    if match is None or unit not in _UNITS:
        raise ValueError(f"size {text!r}: expected a number with an optional unit (B, KiB, MiB, GiB, TiB, KB, MB, "
                         "GB, TB), e.g. 24GiB")
    number = float(match.group(1))
    if not number * _UNITS[unit] <= MAX_SIZE_BYTES:  # inf too (issue 26: 10^20 overflowed deep in the replay)
        raise ValueError(f"size {text[:40]!r}: at most {MAX_SIZE_BYTES // TiB:,} TiB")
    value = int(number * _UNITS[unit])
    if value <= 0:
        raise ValueError(f"size {text[:40]!r}: must be positive")
    return value


def recorded_settings(settings: Any, source: str = "snapshot") -> tuple[AllocatorConfig, list[str]]:
    """The model's config from a snapshot's ``allocator_settings`` (torch ≥ 2.5 writes them); torch's
    defaults, with a note saying so, when there are none. Settings the model cannot honour are noted."""
    if not isinstance(settings, Mapping) or not settings:
        return AllocatorConfig(), ["the snapshot records no allocator_settings (written by torch 2.5 and later): "
                                   "replayed with torch's defaults (no expandable segments, unlimited "
                                   "max_split_size, plain 512 B rounding)"]
    notes = []
    expandable = settings.get("expandable_segments", False)
    split = settings.get("max_split_size", -1)
    split = None if split is None or split < 0 or split >= 1 << 63 else int(split)
    divisions = settings.get("roundup_power2_divisions", 0)
    if isinstance(divisions, Mapping):
        values = sorted(set(divisions.values()))
        if len(values) > 1:
            notes.append(f"per-interval roundup_power2_divisions {dict(divisions)} are not modelled: the model uses "
                         f"{values[-1]} for every size, so rounding may differ")
        divisions = values[-1] if values else 0
    elif isinstance(divisions, (list, tuple)):
        divisions = max(divisions, default=0)
    gc = settings.get("garbage_collection_threshold", 0.0) or 0.0
    if gc > 0:
        notes.append(f"garbage_collection_threshold={gc} is not modelled: segments it freed are replayed as an "
                     "empty_cache at the same point, which may free more")
    try:
        config = AllocatorConfig(max_split_size_bytes=split, expandable_segments=bool(expandable),
                                 roundup_power2_divisions=int(divisions) or None)
    except (ValueError, TypeError) as exc:
        raise SettingsError(f"{source}: allocator_settings: {exc}") from None
    return config, notes


def settings_json(config: AllocatorConfig) -> dict:
    return {
        "expandable_segments": config.expandable_segments,
        "max_split_size_mb": None if config.max_split_size_bytes is None else config.max_split_size_bytes // MiB,
        "roundup_power2_divisions": config.roundup_power2_divisions,
        "PYTORCH_CUDA_ALLOC_CONF": config.to_env(),
    }


MAX_SPLIT_SIZE_MB = MAX_SIZE_BYTES // MiB  # the largest max_split_size_mb a what-if takes (1 PiB, as sizes)
MAX_DIVISIONS = 1 << 16  # as a snapshot's recorded roundup_power2_divisions
_EXPECTED = {"expandable_segments": "True or False",
             "max_split_size_mb": f"a whole number of MiB from 20 to {MAX_SPLIT_SIZE_MB:,}, or -1 / unlimited / none",
             "roundup_power2_divisions": f"0 or a power of 2 under {MAX_DIVISIONS:,}"}


def parse_what_if(text: str, base: AllocatorConfig) -> AllocatorConfig:
    """``KEY=VALUE[,KEY=VALUE...]`` (``:`` works too, as in PYTORCH_CUDA_ALLOC_CONF) over ``base``. A scenario
    that names no setting (``''``, ``,,,``) and a value out of range are refused naming the flag, key and value."""
    kwargs: dict[str, Any] = {"max_split_size_bytes": base.max_split_size_bytes,
                              "expandable_segments": base.expandable_segments,
                              "roundup_power2_divisions": base.roundup_power2_divisions}
    given: dict[str, str] = {}  # key -> the item that set it: a key given twice is refused, never last-wins
    for item in filter(None, (part.strip() for part in str(text).split(","))):
        key, sep, value = (p.strip() for p in (re.split(r"([=:])", item, maxsplit=1) + ["", ""])[:3])
        if not sep or not value:
            raise ValueError(f"--what-if {item!r}: expected KEY=VALUE with KEY one of {', '.join(WHAT_IF_KEYS)}")
        if key in given:
            raise ValueError(f"--what-if {text!r}: {key!r} given twice ({given[key]!r} and {item!r}); give each "
                             "key once per scenario (another --what-if is another scenario)")
        if key not in WHAT_IF_KEYS:
            raise ValueError(f"--what-if {item!r}: unknown or unmodelled key {key!r}; expected one of "
                             f"{', '.join(WHAT_IF_KEYS)}")
        given[key] = item
        kwargs.update(_what_if_value(key, value, item))
    if not given:
        raise ValueError(f"--what-if {text!r}: names no setting; give KEY=VALUE with KEY one of "
                         f"{', '.join(WHAT_IF_KEYS)} (one scenario per --what-if)")
    try:
        return AllocatorConfig(**kwargs)
    except ValueError as exc:
        raise ValueError(f"--what-if {text!r}: {exc}") from None


def _what_if_value(key: str, value: str, item: str) -> dict[str, Any]:
    """The config field ``KEY=VALUE`` sets; a value that is not one (``²`` is no ASCII digit) refused naming them."""
    low = value.lower()
    number = int(low) if re.fullmatch(r"[0-9]{1,20}", low) else None
    if key == "expandable_segments" and low in _TRUE | _FALSE:
        return {"expandable_segments": low in _TRUE}
    if key == "max_split_size_mb" and low in ("-1", "unlimited", "none"):
        return {"max_split_size_bytes": None}
    if key == "max_split_size_mb" and number is not None and number <= MAX_SPLIT_SIZE_MB:
        return {"max_split_size_bytes": number * MiB}
    if key == "roundup_power2_divisions" and number is not None and number < MAX_DIVISIONS:
        return {"roundup_power2_divisions": number or None}
    raise ValueError(f"--what-if {item!r}: {key} takes {_EXPECTED[key]}, not {value[:40]!r}")
