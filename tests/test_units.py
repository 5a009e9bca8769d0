"""Byte units have one home, ``kvlab.units``: its constants and formatters, and no module defining its own."""

from __future__ import annotations

import ast
import pathlib

import pytest

from kvlab.device.replay.settings import parse_size
from kvlab.units import GB, KB, MB, TB, GiB, KiB, MiB, TiB, fmt_bytes, fmt_gib

ROOT = pathlib.Path(__file__).resolve().parents[1]
POWERS = {10: "KiB", 20: "MiB", 30: "GiB", 40: "TiB"}


def test_binary_and_decimal_units():
    assert (KiB, MiB, GiB, TiB) == (2**10, 2**20, 2**30, 2**40)
    assert (KB, MB, GB, TB) == (10**3, 10**6, 10**9, 10**12)


def test_fmt_gib_keeps_gib_at_every_size():
    assert fmt_gib(21.515 * GiB + 1) == "21.52 GiB"
    assert fmt_gib(512 * MiB) == "0.50 GiB"  # fmt_bytes would say 512.00 MiB
    assert fmt_gib(1500 * GiB) == "1,500.00 GiB"
    assert fmt_gib(-2 * GiB) == "-2.00 GiB"
    assert fmt_bytes(512 * MiB) == "512.00 MiB"


@pytest.mark.parametrize(("text", "expected"), [("24GiB", 24 * GiB), ("24 GB", 24 * GB), ("1tib", TiB),
                                                ("2TB", 2 * TB), ("512kb", 512 * KB), ("3MB", 3 * MB)])
def test_parse_size_reads_the_units(text, expected):
    assert parse_size(text) == expected


def _unit_literals(tree: ast.AST):
    """(line, text) of every ``1 << 10|20|30|40`` and ``2 ** 10|20|30|40`` and of every upper-case name bound
    to such a value or to a ``float()`` of one (``GIB = float(1 << 30)``)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.BinOp) and isinstance(node.right, ast.Constant) and isinstance(node.left, ast.Constant):
            if (isinstance(node.op, ast.LShift) and node.left.value == 1 or
                    isinstance(node.op, ast.Pow) and node.left.value == 2) and node.right.value in POWERS:
                yield node.lineno, f"{ast.unparse(node)} (use {POWERS[node.right.value]})"
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in ("KIB", "MIB", "GIB", "TIB")
                                                for t in node.targets):
            yield node.lineno, ast.unparse(node)


def test_no_module_defines_its_own_byte_unit():
    offenders = []
    for path in sorted((ROOT / "kvlab").rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if rel == "kvlab/units.py":
            continue
        offenders += [f"{rel}:{line}: {text}" for line, text in _unit_literals(ast.parse(path.read_text()))]
    assert not offenders, "byte units come from kvlab.units:\n" + "\n".join(offenders)


def test_signed_differences_follow_one_convention():
    from kvlab.units import DIFFERENCE_HEADER, MINUS, fmt_points, fmt_signed_bytes, fmt_signed_int

    assert DIFFERENCE_HEADER == "difference (fix − bug)"
    assert (fmt_signed_int(17_792), fmt_signed_int(-17_792), fmt_signed_int(0)) == ("+17,792", f"{MINUS}17,792", "0")
    assert fmt_signed_bytes(-82_944) == f"{MINUS}81.00 KiB" and fmt_signed_bytes(25 * GiB) == "+25.00 GiB"
    assert fmt_points(-0.001) == "0.00 points" and fmt_points(5.3309) == "+5.33 points"  # never "-0.00"
    assert fmt_points(-2.5, "pt") == f"{MINUS}2.50 pt"


def test_no_negative_zero_and_the_unit_by_magnitude():
    from kvlab.units import byte_unit, fmt_bytes, fmt_gib, fmt_signed_bytes

    assert fmt_bytes(-0.4) == "0 bytes" and fmt_gib(-1) == "0.00 GiB" and fmt_gib(-GiB) == "-1.00 GiB"
    assert fmt_signed_bytes(-0.4) == "0 bytes" and fmt_signed_bytes(-3 * MiB) == "\N{MINUS SIGN}3.00 MiB"
    assert byte_unit(74 * MiB) == ("MiB", MiB) and byte_unit(-74 * MiB) == ("MiB", MiB)
    assert byte_unit(1024) == ("bytes", 1) and byte_unit(1025) == ("KiB", KiB) and byte_unit(2 * GiB)[0] == "GiB"
    for n in (5, 2047, 3 * MiB, 74 * MiB, 7 * GiB):  # fmt_bytes prints in the unit byte_unit names
        assert fmt_bytes(n).endswith(byte_unit(n)[0])
