"""How many of a table's lookups a cache of a share of its rows serves: the hit-rate model.

A fused_uvm_caching table keeps ``load_factor`` of its rows in HBM and fetches the rest over the
host link. Which share of the lookups the cache serves depends on the table's ids:

* a table with a measured ``hit_rate_curve`` (``shardflow spec stats``; or TorchRec's
  ``CacheStatistics`` given to the drop-in planner) follows its curve, read piecewise linearly
  through (0, 0), its points and (1, 1);
* any other table follows the skew model shardflow's synthetic ids are drawn with
  (``rec.data.synthetic``): ids ``rows x u**ID_SKEW``, so the ``f x rows`` hottest rows serve
  ``f**(1 / ID_SKEW)`` of the lookups.

Both say what a cache holding the hottest rows serves (a frequency-ranked cache); the curve is a
distribution over rows, so ``row_of`` draws ids from it for the measuring and training jobs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

# Synthetic ids are ``rows x u**ID_SKEW`` (``rec.data.synthetic``, the measuring job): a few hot rows, a long
# tail, as in click logs. The cost model's distinct-row terms (``rec.cost.unique``) assume it too.
ID_SKEW = 3.0
# The cache sizes (shares of a table's rows) a measured hit-rate curve has a point at (``shardflow spec stats``).
CACHE_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)

Curve = Sequence[tuple[float, float]]  # (cache fraction of rows, share of lookups)


def curve_points(curve: Curve | None) -> tuple[np.ndarray, np.ndarray]:
    """(fractions, hit rates) of ``curve`` with (0, 0) added, and (1, 1) where it has no point at
    1: the piecewise-linear cumulative share of the lookups the hottest rows serve. A point at 1
    stays as given: statistics (TorchRec's ``CacheStatistics``) may count misses with every row
    cached, which TorchRec's estimator prices. None: the skew model, sampled finely."""
    if curve is None:
        f = np.concatenate(([0.0], np.geomspace(1e-6, 1.0, 241)))
        return f, f ** (1.0 / ID_SKEW)
    f = np.array([0.0, *(p[0] for p in curve)], dtype=np.float64)
    h = np.array([0.0, *(p[1] for p in curve)], dtype=np.float64)
    if f[-1] < 1.0:
        f, h = np.append(f, 1.0), np.append(h, 1.0)
    return f, h


def hit_rate(load_factor: np.ndarray | float, curve: Curve | None = None) -> np.ndarray:
    """Share of the lookups a cache of ``load_factor`` of the rows serves (0 to 1)."""
    lf = np.clip(np.asarray(load_factor, dtype=np.float64), 0.0, 1.0)
    if curve is None:
        out: np.ndarray = lf ** (1.0 / ID_SKEW)
        return out
    f, h = curve_points(curve)
    interpolated: np.ndarray = np.interp(lf, f, h)
    return interpolated


def miss_rate(load_factor: np.ndarray | float, curve: Curve | None = None) -> np.ndarray:
    """``1 - hit_rate``: the share of lookups fetched over the host link."""
    out: np.ndarray = 1.0 - hit_rate(load_factor, curve)
    return out


def row_of(u: np.ndarray, rows: int, curve: Curve | None = None) -> np.ndarray:
    """Rows (int64 in [0, rows)) for uniform ``u`` in [0, 1): the inverse of the hit-rate curve, so
    row ``r`` is the ``r``-th hottest. The skew model gives ``rows x u**ID_SKEW``."""
    if curve is None:
        share = np.asarray(u, dtype=np.float64) ** ID_SKEW
    else:
        f, h = curve_points(curve)
        share = _inverse(np.asarray(u, dtype=np.float64), f, h)
    return np.minimum((share * rows).astype(np.int64), max(rows - 1, 0))


def _inverse(u: np.ndarray, f: np.ndarray, h: np.ndarray) -> np.ndarray:
    """``f`` where the piecewise-linear ``h(f)`` reaches ``u``; a flat piece (no lookups) is skipped."""
    k = np.clip(np.searchsorted(h, u, side="right"), 1, len(h) - 1)
    h0, h1, f0, f1 = h[k - 1], h[k], f[k - 1], f[k]
    width = np.where(h1 > h0, h1 - h0, 1.0)
    out: np.ndarray = f0 + (f1 - f0) * np.clip((u - h0) / width, 0.0, 1.0)
    return out


# Below this many rows ``hottest x multiplier`` (both below 2**31) is exact in int64.
INT64_SPREAD_ROWS = 2**31
_GOLDEN = (5**0.5 - 1) / 2  # consecutive multiples of rows x this, mod rows, fall evenly over [0, rows)


def spread_multiplier(rows: int) -> int:
    """The multiplier ``spread`` scatters a table of ``rows`` rows with: the integer nearest
    ``rows x 0.618...`` that shares no factor with ``rows`` (so that multiplying is a bijection)."""
    a = max(1, round(rows * _GOLDEN))
    while math.gcd(a, rows) != 1:
        a += 1
    return a


def spread(hottest: np.ndarray, rows: int) -> np.ndarray:
    """The table row of the ``hottest``-th hottest row: ``hottest x spread_multiplier(rows) mod rows``.
    Any run of hot rows falls evenly over the table (Fibonacci hashing), as hashed ids do, so every
    row-wise shard sees the table's skew rather than one holding its head."""
    if rows <= 1:
        return np.zeros_like(hottest, dtype=np.int64)
    a = spread_multiplier(rows)
    if rows < INT64_SPREAD_ROWS:
        return (hottest.astype(np.int64) * a) % rows
    return np.array([int(r) * a % rows for r in hottest.tolist()], dtype=np.int64)
