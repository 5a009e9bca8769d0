"""How the subcommands print a comparison: the bug's arm, the fix's, and fix − bug (kvlab.units' convention)."""

from __future__ import annotations

import json

from kvlab.units import DIFFERENCE_HEADER, fmt_bytes, fmt_points, fmt_signed_bytes, fmt_signed_int, with_sign


def difference(bug: dict, fix: dict, skip: tuple = ()) -> dict:
    """fix − bug (kvlab.units' convention) for every numeric field both share (bools and text are not differences)."""
    out = {}
    for key, b in bug.items():
        a = fix.get(key)
        if key in skip or isinstance(a, bool) or isinstance(b, bool):
            continue
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            out[key] = round(a - b, 6) if isinstance(a, float) or isinstance(b, float) else a - b
    return out


def shown(key: str, value, percent: tuple = (), byte_keys: bool = False, signed: bool = False) -> str:
    if value is None:
        return "—"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, str):
        return value
    if key in percent:
        return fmt_points(value * 100) if signed else f"{value:.2%}"
    if byte_keys and key.endswith("_bytes"):
        return fmt_signed_bytes(value) if signed else fmt_bytes(value)
    if signed:
        return fmt_signed_int(value) if isinstance(value, int) else with_sign(f"{abs(value):,.2f}", value)
    return f"{value:,}" if isinstance(value, int) else f"{value:,.2f}"


def print_compare(title: str, bug: tuple, fix: tuple, *, skip: tuple = (), as_json: bool = False,
                   percent: tuple = (), byte_keys: bool = False) -> None:
    """The bug's arm, the fix's, then fix − bug (kvlab.units' convention); ``bug``/``fix`` are (key, caption, fields)."""
    (bkey, bcap, bfields), (fkey, fcap, ffields) = bug, fix
    diff = difference(bfields, ffields, skip)
    if as_json:
        print(json.dumps({bkey: bfields, fkey: ffields, "difference": {"of": f"{fkey} - {bkey}", **diff}}, indent=2))
        return
    print(title)
    keys = [k for k in bfields if k not in skip]
    width = max(map(len, keys))
    head = (f"{bkey} ({bcap})", f"{fkey} ({fcap})", DIFFERENCE_HEADER)
    cols = [max(16, len(h)) for h in head]
    print(f"  {'':<{width}}  {head[0]:>{cols[0]}}  {head[1]:>{cols[1]}}  {head[2]:>{cols[2]}}")
    notes = []
    for key in keys:
        b = shown(key, bfields[key], percent, byte_keys)
        a = shown(key, ffields.get(key), percent, byte_keys)
        d = shown(key, diff[key], percent, byte_keys, signed=True) if key in diff and diff[key] else ""
        if max(len(a), len(b)) > max(cols[:2]):  # long text (an error message): under the table, per arm
            notes += [f"  {key} ({arm}): {text}" for arm, text in ((bkey, b), (fkey, a)) if text != "—"]
            b, a = ("see below" if t != "—" else t for t in (b, a))
        print(f"  {key:<{width}}  {b:>{cols[0]}}  {a:>{cols[1]}}  {d:>{cols[2]}}")
    for note in notes:
        print(note)
