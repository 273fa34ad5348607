"""Synthetic ids drawn on a device: the torch twin of ``rec.hit_rates.row_of`` then ``spread``.

The measuring job draws millions of ids per batch on the GPU; this draws them there, with no host
sync per id (``torch.searchsorted`` through the curve), and gives the rows the numpy draw
(``rec.data.synthetic.table_ids``) gives for the same uniforms.
"""

from __future__ import annotations

import torch

from rec.hit_rates import ID_SKEW, INT64_SPREAD_ROWS, Curve, curve_points, spread, spread_multiplier


def row_of(u: torch.Tensor, rows: int, curve: Curve | None = None) -> torch.Tensor:
    """``rec.hit_rates.row_of`` on ``u``'s device: int64 rows in [0, rows), row ``r`` the ``r``-th hottest."""
    u = u.to(torch.float64)
    if curve is None:
        share = u**ID_SKEW
    else:
        f_np, h_np = curve_points(curve)
        f = torch.as_tensor(f_np, dtype=torch.float64, device=u.device)
        h = torch.as_tensor(h_np, dtype=torch.float64, device=u.device)
        k = torch.searchsorted(h, u, right=True).clamp_(1, len(h) - 1)
        h0, h1, f0, f1 = h[k - 1], h[k], f[k - 1], f[k]
        width = torch.where(h1 > h0, h1 - h0, torch.ones_like(h1))
        share = f0 + (f1 - f0) * ((u - h0) / width).clamp_(0.0, 1.0)
    return (share * rows).to(torch.int64).clamp_(max=max(rows - 1, 0))


def spread_rows(hottest: torch.Tensor, rows: int) -> torch.Tensor:
    """``rec.hit_rates.spread`` on ``hottest``'s device: the table row of each hottest-rank. Tables of
    ``INT64_SPREAD_ROWS`` rows or more (beyond any real table) go through the exact host version."""
    if rows <= 1:
        return torch.zeros_like(hottest, dtype=torch.int64)
    if rows >= INT64_SPREAD_ROWS:
        exact = spread(hottest.cpu().numpy(), rows)
        return torch.from_numpy(exact).to(hottest.device)
    return (hottest.to(torch.int64) * spread_multiplier(rows)).remainder_(rows)


def table_ids(u: torch.Tensor, rows: int, curve: Curve | None = None) -> torch.Tensor:
    """A table's ids for uniform ``u``: drawn from its hit-rate curve (None: the skew model), the hot
    rows scattered over the table."""
    return spread_rows(row_of(u, rows, curve), rows)
