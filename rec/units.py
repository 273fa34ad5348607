"""Byte sizes and bandwidths as people write them ("80GiB", "512 GB", "600GB/s"), and numbers as they read them."""

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
_FORMAT_UNITS = ("B", "KiB", "MiB", "GiB", "TiB", "PiB", "EiB")
MAX_BYTES = 2**80  # the largest byte count parse_bytes reads from text; bounds are checked by callers


def parse_bytes(value: object) -> int:
    """Bytes from an int or a string such as "80GiB", "512 GB", "1.5TiB"; ValueError otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"expected a byte size, got {value!r}")
    if isinstance(value, Integral):
        return int(value)
    if isinstance(value, Real):
        number = float(value)
        if not math.isfinite(number) or number != int(number):
            raise ValueError(f"expected a whole number of bytes, got {value!r}")
        return int(number)
    if isinstance(value, str):
        match = _SIZE.match(value)
        unit = match.group(2).upper() if match else ""
        if match and (unit or "B") in UNITS:
            scale = UNITS[unit or "B"]
            approx = float(match.group(1)) * scale  # first, so "1e999999999" is not built exactly
            if approx > MAX_BYTES:
                raise ValueError(f"{value!r} is more bytes than any memory holds (at most 2^80)")
            whole = f"expected a whole number of bytes, got {value!r}"  # "16.5" as 16.5 unquoted is
            if approx < 1:
                if scale == 1 and approx > 0:
                    raise ValueError(whole)
                return 0
            exact = Fraction(match.group(1)) * scale  # keeps "1.5TiB" exact
            if scale == 1 and exact.denominator != 1:
                raise ValueError(whole)
            return int(exact)  # a fractional byte left over by a unit ("1.3GB") is rounded down
        raise ValueError(
            f"cannot read {value!r} as a byte size (e.g. 80GiB, 512 GB, 1.5TiB; units {_UNIT_NAMES})"
        )
    raise ValueError(f"expected a byte size, got {value!r}")


_BITS = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([KMGTP]?)(?:bit|bits)\s*$", re.IGNORECASE)
_BIT_PREFIX = {"": 1, "K": 1000, "M": 1000**2, "G": 1000**3, "T": 1000**4, "P": 1000**5}
_AMBIGUOUS = re.compile(r"^\s*[0-9.eE+-]+\s*[KMGTP]i?b\s*$")  # "100Gb": bits, as network speeds are written


def parse_bytes_per_second(value: object) -> float:
    """Bytes/s from a number or a string such as "600GB/s", "25 GiB/s" or "400Gbit/s" (bits: an
    eighth as many bytes); ValueError otherwise, and for "100Gb/s", whose lowercase b a network
    speed means as bits but a byte size reads as bytes."""
    written = value
    if isinstance(value, str) and value.rstrip().lower().endswith("/s"):
        value = value.rstrip()[:-2]
    if isinstance(value, str):
        bits = _BITS.match(value)
        if bits:
            return float(Fraction(bits.group(1)) * _BIT_PREFIX[bits.group(2).upper()] / 8)
        if _AMBIGUOUS.match(value):
            raise ValueError(f"{written!r}: a lowercase b is a bit in network speeds, a byte elsewhere: write bytes "
                             "with B (12.5GB/s) or bits with bit (100Gbit/s)")
    if isinstance(value, Real) and not isinstance(value, (bool, Integral)):
        if not math.isfinite(value):
            raise ValueError(f"expected a bandwidth in bytes/s, got {value!r}")
        return float(value)
    plain = _SIZE.match(value) if isinstance(value, str) else None
    if plain and plain.group(2).upper() in ("", "B"):  # bytes/s need not be whole: "0.5" is half a byte
        number = float(plain.group(1))
        if not math.isfinite(number):
            raise ValueError(f"expected a finite bandwidth in bytes/s, got {written!r}")
        return number
    try:
        return float(parse_bytes(value))
    except OverflowError:  # an int beyond float
        raise ValueError(f"expected a finite bandwidth in bytes/s, got {value!r}") from None
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


def format_count(n: int) -> str:
    """A whole number for a message: digit groups, or its magnitude when it is too long to read."""
    digits = len(str(abs(n)))
    return f"{n:,}" if digits <= 21 else f"{'-' if n < 0 else ''}about 10^{digits - 1}"


def counted(n: int, noun: str) -> str:
    """``n`` and ``noun``, plural but for one: "1 rank", "8 ranks"."""
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def power_of_two(n: int) -> str:
    """"2^k" for a bound n = 2^k, as messages name the bounds."""
    return f"2^{n.bit_length() - 1}"
