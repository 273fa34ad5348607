"""What happens to an id outside its table's rows ``[0, num_embeddings)``: ``--ids``.

``error`` stops the job naming the feature; ``modulo`` maps an id to ``id mod rows`` (a negative id
as an unsigned 64-bit number); ``hash`` maps it to ``hash64(id) mod rows``, where ``hash64`` is a
fixed 64-bit mix (splitmix64's finalizer), the same on every machine and in every version.
Both mappings apply to every id, in range or not, so a table sees one consistent id space.
"""

from __future__ import annotations

from enum import StrEnum

import numpy as np


class IdsPolicy(StrEnum):
    ERROR = "error"  # an id outside [0, rows) stops the job, naming the feature
    MODULO = "modulo"  # id mod rows
    HASH = "hash"  # hash64(id) mod rows


_C1 = np.uint64(0xBF58476D1CE4E5B9)
_C2 = np.uint64(0x94D049BB133111EB)


def hash64(ids: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer of each id (its 64 bits as unsigned): a bijection on 64-bit values."""
    z = ids.astype(np.int64, copy=False).view(np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * _C1
        z = (z ^ (z >> np.uint64(27))) * _C2
        return z ^ (z >> np.uint64(31))


def out_of_range(ids: np.ndarray, rows: int) -> np.ndarray:
    """Where ``ids`` fall outside ``[0, rows)``."""
    result: np.ndarray = (ids < 0) | (ids >= rows)
    return result


def map_ids(ids: np.ndarray, rows: int, policy: IdsPolicy) -> np.ndarray:
    """``ids`` (int64) as rows of a table of ``rows`` under ``modulo`` or ``hash`` (``error``:
    unchanged, the caller checks the range)."""
    if policy is IdsPolicy.ERROR:
        return ids
    unsigned = hash64(ids) if policy is IdsPolicy.HASH else ids.astype(np.int64, copy=False).view(np.uint64)
    mapped: np.ndarray = (unsigned % np.uint64(rows)).astype(np.int64)
    return mapped
