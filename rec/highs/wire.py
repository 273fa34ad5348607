"""The frames a HiGHS worker and the process that started it exchange over its pipes: a JSON header
and raw arrays, never a pickle.

A frame is its header's length (8 bytes, little-endian), the header (UTF-8 JSON, with ``arrays``:
``[[name, dtype, length], ...]``), then each array's bytes in that order. Arrays travel as
little-endian float64 or int64, or as bytes (bool).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

import numpy as np

HEADER_LIMIT = 1 << 20  # a header is a few hundred bytes; more is a stream out of step
WIRE_DTYPES = ("<f8", "<i8", "|u1")


class WireError(Exception):
    """A frame that cannot be read: the stream ended inside it, or it is not one of ours."""


def frame(header: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> bytes:
    """``header`` and ``arrays`` as one frame."""
    wired = {name: _wired(a) for name, a in arrays.items()}
    text = json.dumps({**header, "arrays": [[n, a.dtype.str, len(a)] for n, a in wired.items()]}).encode()
    return b"".join((len(text).to_bytes(8, "little"), text, *(a.tobytes() for a in wired.values())))


def read_frame(fd: int) -> tuple[dict[str, Any], dict[str, np.ndarray]] | None:
    """The next frame on file descriptor ``fd`` as (header, arrays); None where the stream ends
    before one begins. WireError where it ends inside one or is not a frame."""
    first = os.read(fd, 8)
    if not first:
        return None
    size = int.from_bytes(_exactly(fd, 8, first), "little")
    if size > HEADER_LIMIT:
        raise WireError(f"a header of {size} bytes")
    try:
        header = json.loads(_exactly(fd, size))
        listed = [(str(n), str(d), int(k)) for n, d, k in header.pop("arrays")]
    except (ValueError, TypeError, KeyError, AttributeError) as e:
        raise WireError(f"a header that is not one: {e}") from None
    arrays = {}
    for name, dtype, length in listed:
        if dtype not in WIRE_DTYPES or length < 0:
            raise WireError(f"array {name!r}: {dtype} x {length}")
        arrays[name] = np.frombuffer(_exactly(fd, length * np.dtype(dtype).itemsize), dtype=dtype)
    return header, arrays


def write_frame(fd: int, data: bytes) -> None:
    """All of ``data`` to file descriptor ``fd`` (a pipe takes it in pieces)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def _exactly(fd: int, size: int, got: bytes = b"") -> bytes:
    parts, have = [got], len(got)
    while have < size:
        part = os.read(fd, min(size - have, 1 << 20))
        if not part:
            raise WireError(f"the stream ended {size - have} bytes short of a frame")
        parts.append(part)
        have += len(part)
    return b"".join(parts)


def _wired(a: np.ndarray) -> np.ndarray:
    a = np.asarray(a)
    if a.dtype == np.bool_:
        return np.ascontiguousarray(a, dtype="|u1")
    if a.dtype.kind in "iu":
        return np.ascontiguousarray(a, dtype="<i8")
    return np.ascontiguousarray(a, dtype="<f8")
