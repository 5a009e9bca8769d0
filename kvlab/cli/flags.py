"""Argument types and registries the subcommands' parsers share (argparse value checks that name the flag)."""

from __future__ import annotations

import argparse
import importlib
import sys
from typing import Any

from kvlab.argtypes import MAX_PAGE_POOL as MAX_PAGE_POOL  # re-exported: the largest pool the page engine takes
from kvlab.argtypes import MAX_POOL as MAX_POOL  # re-exported: the largest pool and batch simulate takes


def fraction(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1), got {text!r}") from None
    if not 0 < value < 1:
        raise argparse.ArgumentTypeError(f"--mem-fraction-static must be in (0, 1), got {value}")
    return value


def fraction_le1(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number in (0, 1], got {text!r}") from None
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"--gpu-memory-utilization must be in (0, 1], got {value}")
    return value


def hicache_number(flag: str):
    """An argparse type for ``--hicache-ratio`` / ``--hicache-size``: a finite number in (0, the largest
    ``SchedulerConfig`` takes], refused naming ``flag`` (exit 2)."""
    import math

    def parse(text: str) -> float:
        from kvlab.sched.config import MAX_HICACHE  # here, not at parser build: kvlab --help imports no torch

        top = MAX_HICACHE["hicache_ratio" if flag == "--hicache-ratio" else "hicache_size_gib"]
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}: expected a number, got {text!r}") from None
        if not math.isfinite(value) or not 0 < value <= top:
            raise argparse.ArgumentTypeError(f"{flag} must be in (0, {top:g}], got {text}")
        return value

    return parse


def registry(module: str, name: str, needed: bool) -> Any:
    """The registry ``module.name`` when a subcommand that offers its names is being built, else ``()``: the
    registries live beside torch (the simulator, the scenarios), and a parser built for another subcommand never
    reads them (argparse parses with the chosen subcommand's parser only)."""
    return getattr(importlib.import_module(module), name) if needed else ()


def registered_or(names: tuple[str, ...], module: str, registry: str) -> list[str]:
    """The live registry's names when its module is loaded already (a policy someone registered is one of them),
    else the spelled-out ``names`` (loading it would import torch)."""
    loaded = sys.modules.get(module)
    return sorted(getattr(loaded, registry)) if loaded is not None else list(names)
