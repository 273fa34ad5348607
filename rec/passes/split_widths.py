"""Plans under a profile that prices kernel groups' widest rows (``widest_dim_multiplier``).

FBGEMM runs a rank's tables of one sharding type at the width of the widest (``rec.cost.widest``);
the search balances per-shard times and cannot see it, so under such a profile it may put 16-column
tables with many ids beside a 256-column one and lose more than the balance gains. After the search,
for each sharding type whose kernel groups mix widths, two plans are searched again: one with the
group's narrower tables kept off that type, one with its widest tables kept off it. A plan whose
predicted time (``rec.analysis.rank_times.predicted_critical_path``: widest rows and plan-level terms
counted) is lower replaces the first, and the same is tried on it, at most ``MAX_ROUNDS`` times. The
plan keeps the bound of the whole search space. Under a profile without the term nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from rec.analysis.build import build_plan
from rec.analysis.rank_times import lanes_below_widest, predicted_critical_path
from rec.config.cost import CostConfig
from rec.config.search import SearchConfig
from rec.errors import InputError
from rec.passes.context import RELATIVE_GAIN, PassContext
from rec.plan.types import Plan
from rec.search.result import SearchResult
from rec.search.space import SearchSpace, without_options
from rec.spec.types import Spec
from rec.topology.types import Topology

MAX_ROUNDS = 4  # each accepted split searches again; a few suffice for the sharding types there are


def with_split_widths(result: SearchResult, spec: Spec, topology: Topology, cost: CostConfig, config: SearchConfig,
                      search: Callable[[SearchSpace], SearchResult]) -> SearchResult:
    """``result``, or a plan searched with the narrow or the wide tables of a mixed-width kernel
    group kept off its sharding type, whichever is predicted fastest (``search`` searches a space)."""
    if not cost.profile.extensions.widest_dim_multiplier:
        return result

    def rated(r: SearchResult) -> tuple[float, Plan]:
        plan = build_plan(r, spec, topology, cost, config, r.info)
        return predicted_critical_path(plan), plan

    best = result
    best_value, plan = rated(result)
    for _ in range(MAX_ROUNDS):
        narrow, wide = lanes_below_widest(plan)  # (T,) bool each, spec order
        st_of_table = plan.columns.sharding_type
        candidates = []
        for code in np.unique(st_of_table[narrow]):
            of_type = best.space.options.sharding_type == code
            for keep_off in (narrow & (st_of_table == code), wide & (st_of_table == code)):
                banned = keep_off[best.space.options.table] & of_type
                space = without_options(best.space, banned) if banned.any() else None
                if space is None:
                    continue
                try:
                    candidates.append(search(space))
                except InputError:  # they do not fit elsewhere
                    continue
        scored = [(*rated(c), i, c) for i, c in enumerate(candidates)]
        winner = min(scored, key=lambda x: (x[0], x[2]), default=None)
        if winner is None or winner[0] >= best_value * (1 - RELATIVE_GAIN):
            break
        best_value, plan, _, best = winner
    if best is result:
        return result
    return replace(best, space=result.space, bound=result.bound, info=result.info)


class SplitWidths:
    """``with_split_widths`` as a whole-plan pass: under a profile with ``widest_dim_multiplier``."""

    def applies(self, context: PassContext) -> bool:
        return bool(context.cost.profile.extensions.widest_dim_multiplier) and context.search is not None

    def run(self, result: SearchResult, context: PassContext) -> SearchResult:
        assert context.search is not None
        return with_split_widths(result, context.spec, context.topology, context.cost, context.config,
                                 context.search)
