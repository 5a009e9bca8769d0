"""Byte and token units, and the few integer helpers every layer uses.

Quantities carry their unit in their name (``_bytes``, ``_tokens``, ``_pages``); conversions go
through these helpers rather than inline arithmetic.
"""

from __future__ import annotations

KiB = 1024
MiB = 1024 * KiB
GiB = 1024 * MiB
TiB = 1024 * GiB
#: powers of two as plain counts (token ids, pool tokens), not byte sizes
POW2_30 = 1 << 30
POW2_40 = 1 << 40
KB = 10**3
MB = 10**6
GB = 10**9
TB = 10**12


def div_ceil(a: int, b: int) -> int:
    """Ceiling division for non-negative ints."""
    return -(-a // b)


def align_up(n: int, alignment: int) -> int:
    """Smallest multiple of ``alignment`` that is >= ``n``."""
    return div_ceil(n, alignment) * alignment


def align_down(n: int, alignment: int) -> int:
    """Largest multiple of ``alignment`` that is <= ``n``."""
    return (n // alignment) * alignment


def pages_to_tokens(pages: int, page_size: int) -> int:
    return pages * page_size


def tokens_to_pages(tokens: int, page_size: int) -> int:
    """Pages needed to hold ``tokens`` (rounded up)."""
    return div_ceil(tokens, page_size)


def byte_unit(n: float) -> tuple[str, int]:
    """The unit :func:`fmt_bytes` prints ``n`` bytes in, and its size: ``("MiB", MiB)`` for 74 MiB. A figure
    scales its axis by the unit of its largest value, so a 74 MiB snapshot is drawn in MiB, not as 0.07 GiB."""
    n = abs(n)
    if n <= KiB:
        return "bytes", 1
    for unit, size in (("KiB", KiB), ("MiB", MiB)):
        if n <= size * 1024:
            return unit, size
    return "GiB", GiB


def fmt_bytes(n: float) -> str:
    """Human-readable bytes in binary units, exactly as torch's OOM message prints them (``20.00 MiB``;
    like torch's ``format_size`` a value of exactly 1 KiB/MiB/GiB prints in the unit below). Never a negative
    zero: a value that rounds to zero prints without a sign."""
    unit, size = byte_unit(n)
    text = f"{int(abs(n))} bytes" if size == 1 else f"{abs(n) / size:.2f} {unit}"
    return ("-" if n < 0 and not is_zero_text(text) else "") + text


def is_zero_text(text: str) -> bool:
    """Whether a formatted number shows zero (``0.00 GiB``, ``0 bytes``): it then takes no sign."""
    return not any(c in "123456789" for c in text)


def fmt_gib(n: float) -> str:
    """Bytes in GiB with two decimals and thousands separators, whatever the size (``21.52 GiB``): the unit
    of the finding-1 tables, where rows are compared with each other. Never ``-0.00 GiB``."""
    text = f"{abs(n) / GiB:,.2f} GiB"
    return ("-" if n < 0 and not is_zero_text(text) else "") + text


def fmt_signed_float(x: float, digits: int = 2) -> str:
    """``+0.37`` / ``-7.60`` / ``0.00``: a signed number (GiB in a table), never ``-0.00`` nor ``+0.00``."""
    text = f"{abs(x):.{digits}f}"
    return ("" if is_zero_text(text) else "+" if x > 0 else "-") + text


# ---- one convention for a bug beside its fix ----------------------------------------------------------
# Every surface that compares the two arms of a finding (notebook tables, the report's index and summary.json,
# ``kvlab simulate --compare``, ``kvlab repro kv-pool-sizing --compare``) shows the bug's column first, then the
# fix's, then their difference fix − bug: positive when the fix has more. Signed numbers print "+" or the
# minus sign "−" (U+2212), and a difference that rounds to zero prints without a sign.
DIFFERENCE = "fix − bug"
DIFFERENCE_HEADER = f"difference ({DIFFERENCE})"
MINUS = "\N{MINUS SIGN}"


def with_sign(text: str, value: float) -> str:
    """``text`` (the magnitude, formatted) with the sign of ``value``: "+", "−" or none at zero."""
    return ("+" if value > 0 else MINUS if value < 0 else "") + text


def fmt_signed_int(n: int) -> str:
    """``+17,792`` / ``−17,792`` / ``0``: a count's difference, thousands separated."""
    return with_sign(f"{abs(int(n)):,}", n)


def fmt_signed_bytes(n: float) -> str:
    """A difference in bytes through :func:`fmt_bytes` (unit by magnitude): ``+25.70 GiB``, ``−81.00 KiB``."""
    text = fmt_bytes(abs(n))
    return with_sign(text, 0 if is_zero_text(text) else n)


def fmt_points(points: float, unit: str = "points") -> str:
    """A difference of percentages, in percentage points with two decimals; never ``-0.00``."""
    rounded = round(points, 2)
    return with_sign(f"{abs(rounded):.2f} {unit}", rounded)
