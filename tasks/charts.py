"""The per-rank chart logged with every plan: estimated time and memory on each rank."""

from __future__ import annotations

from pathlib import Path

from rec.plan import Plan

GIB = 1024**3


def rank_load_chart(plan: Plan, path: str | Path) -> Path:
    """PNG with two panels: estimated ms per iteration per rank (with the critical path and the
    lower bound), and HBM/DDR per rank against the HBM capacity."""
    import numpy as np
    from matplotlib.backends.backend_agg import FigureCanvasAgg  # Agg: no display, no global state
    from matplotlib.figure import Figure
    from matplotlib.ticker import MaxNLocator

    m = plan.metrics
    ranks = np.arange(len(m.rank_perf))
    fig = Figure(figsize=(max(6.0, 0.25 * len(ranks)), 6.0), layout="constrained")
    FigureCanvasAgg(fig)
    perf, memory = fig.subplots(2, 1, sharex=True)
    perf.bar(ranks, m.rank_perf, color="tab:blue")
    perf.axhline(m.critical_path, color="tab:red", label=f"critical path {m.critical_path:.4g} ms")
    perf.axhline(m.lower_bound, color="tab:gray", linestyle="--",
                 label=f"lower bound {m.lower_bound:.4g} ms")
    perf.set_ylabel("est. ms / iteration")
    perf.set_title(f"plan {plan.plan_id}: {len(plan.tables)} tables on {len(ranks)} ranks")
    perf.legend(loc="lower right", fontsize="small")
    width = 0.4
    memory.bar(ranks - width / 2, np.array(m.rank_hbm) / GIB, width, label="HBM", color="tab:green")
    memory.bar(ranks + width / 2, np.array(m.rank_ddr) / GIB, width, label="DDR", color="tab:orange")
    if any(m.rank_hbm_cap):
        memory.axhline(max(m.rank_hbm_cap) / GIB, color="tab:green", linestyle=":", label="HBM cap")
    memory.set_ylabel("GiB")
    memory.set_xlabel("rank")
    memory.xaxis.set_major_locator(MaxNLocator(integer=True))
    memory.legend(loc="lower right", fontsize="small")
    path = Path(path)
    fig.savefig(path, dpi=100)
    return path
