"""Byte sizes and bandwidths as people write them ("80GiB", "512 GB", "600GB/s") and read them."""

from __future__ import annotations

import math
import re
from fractions import Fraction
from numbers import Integral, Real

UNITS = {
    "B": 1,
    "KB": 1000,
    "MB": 1000**2,
    "GB": 1000**3,
    "TB": 1000**4,
    "PB": 1000**5,
    "KIB": 1024,
    "MIB": 1024**2,
    "GIB": 1024**3,
    "TIB": 1024**4,
    "PIB": 1024**5,
}
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([A-Za-z]*)\s*$")
_UNIT_NAMES = "B, KB, MB, GB, TB, KiB, MiB, GiB, TiB"
_FORMAT_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB")


def parse_bytes(value: object) -> int:
    """Bytes from an int or a string such as "80GiB", "512 GB", "1.5TiB"; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"expected a byte size, got {value!r}")
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        if not math.isfinite(value) or value != int(value):
            raise ValueError(f"expected a whole number of bytes, got {value!r}")
        return int(value)
    if isinstance(value, str):
        match = _SIZE.match(value)
        unit = match.group(2).upper() if match else ""
        if match and (unit or "B") in UNITS:
            # Fraction keeps "1.5TiB" exact; a fractional byte left over is rounded down.
            return int(Fraction(match.group(1)) * UNITS[unit or "B"])
        raise ValueError(
            f"cannot read {value!r} as a byte size (e.g. 80GiB, 512 GB, 1.5TiB; units {_UNIT_NAMES})"
        )
    raise ValueError(f"expected a byte size, got {value!r}")


def parse_bytes_per_second(value: object) -> float:
    """Bytes/s from a number or a string such as "600GB/s" or "25 GiB/s"; ValueError otherwise."""
    if isinstance(value, str) and value.rstrip().lower().endswith("/s"):
        value = value.rstrip()[:-2]
    if isinstance(value, Real) and not isinstance(value, (bool, Integral)):
        if not math.isfinite(value):
            raise ValueError(f"expected a bandwidth in bytes/s, got {value!r}")
        return float(value)
    try:
        return float(parse_bytes(value))
    except ValueError:
        raise ValueError(f"cannot read {value!r} as a bandwidth in bytes/s (e.g. 600GB/s, 12.5e9)") from None


def format_bytes(n: float) -> str:
    """Human-readable binary size: 1536 -> "1.5 KiB"."""
    size = float(n)
    for unit in _FORMAT_UNITS:
        if abs(size) < 1024 or unit == _FORMAT_UNITS[-1]:
            return f"{int(size)} B" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    raise AssertionError("unreachable")
