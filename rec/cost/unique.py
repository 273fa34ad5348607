"""How many distinct rows a batch touches: the expected count under the ids shardflow measures with.

The measuring and training jobs draw ids as ``rows x u**ID_SKEW`` (``rec.data.synthetic``): a few hot
rows and a long tail. ``n`` such ids hit, in expectation, ``rows x g(n / (ID_SKEW x rows))``
distinct rows, where ``g(lam) = integral over t in (0, 1] of 1 - exp(-lam t**(1/ID_SKEW - 1))``
(the Poisson limit of the row probabilities): about ``n`` while ``n`` is small against ``rows``,
``rows`` once ``n`` is far above it. A row touched once costs a cache miss forward and an optimizer
update backward however many of the batch's ids hit it, so a profile can price it
(``unique_read_size_multiplier``, ``unique_lookup_size_multiplier``; 0 by default, TorchRec has no
such term).
"""

from __future__ import annotations

import functools

import numpy as np

from rec.hit_rates import ID_SKEW, Curve, curve_points

_LAM = np.geomspace(1e-9, 1e9, 721)  # g below the grid: lam x ID_SKEW (= n / rows); above: 1


def _g(lam: np.ndarray) -> np.ndarray:
    """g on ``lam``, by Gauss-Legendre after t = v**3 (a bounded integrand: 3 v**2 (1 - exp(...)))."""
    v, w = np.polynomial.legendre.leggauss(256)
    v, w = (v + 1) / 2, w / 2
    exponent = 3 * (1 - 1 / ID_SKEW)
    inner = 1 - np.exp(-np.outer(lam, v ** -exponent))
    out: np.ndarray = inner @ (3 * v**2 * w)
    return out


@functools.cache
def _table() -> np.ndarray:
    """g on the grid, made at the first use: its eigenvalue solve costs a process that imports this
    module (every ``shardflow train``) 0.02-0.5 CPU-s."""
    return _g(_LAM)


def expected_distinct(ids: np.ndarray | float, rows: np.ndarray | float) -> np.ndarray:
    """Expected distinct rows ``ids`` ids (per batch, float) hit in a shard of ``rows`` rows."""
    ids, rows = np.broadcast_arrays(np.asarray(ids, dtype=np.float64), np.asarray(rows, dtype=np.float64))
    safe = np.maximum(rows, 1.0)
    lam = ids / (ID_SKEW * safe)
    g = np.interp(np.log(np.maximum(lam, _LAM[0])), np.log(_LAM), _table(), right=1.0)
    out: np.ndarray = np.where(lam < _LAM[0], ids, safe * g)
    return np.where(rows > 0, np.minimum(out, np.minimum(ids, rows)), 0.0)


def expected_touched(ids: float, rows: int, curve: Curve | None = None) -> float:
    """Expected distinct rows ``ids`` draws of ``row_of`` touch: each piece of the curve spreads its
    share of the lookups evenly over its rows; the skew model's is ``expected_distinct``."""
    if curve is None:
        return float(expected_distinct(ids, rows))
    f, h = curve_points(curve)
    bounds = np.floor(f * rows).astype(np.int64)
    total = 0.0
    for lo, hi, share in zip(bounds[:-1], bounds[1:], np.diff(h), strict=True):
        n = int(hi - lo)
        if n <= 0 or share <= 0:
            continue
        p = share / n
        total += n * -np.expm1(ids * np.log1p(-p)) if p < 1 else n
    return total
