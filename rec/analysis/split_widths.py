"""Plans under a profile that prices kernel groups' widest rows (``widest_dim_multiplier``).

FBGEMM runs a rank's tables of one sharding type at the width of the widest (``rec.cost.widest``);
the search balances per-shard times and cannot see it, so under such a profile it may put 16-column
tables with many ids beside a 256-column one and lose more than the balance gains. After the search,
for each sharding type whose kernel groups mix widths, two plans are searched again: one with the
group's narrower tables kept off that type, one with its widest tables kept off it. A plan whose
predicted time (``rec.analysis.predict.predicted_critical_path``: widest rows and plan-level terms
counted) is lower replaces the first, and the same is tried on it, at most ``MAX_ROUNDS`` times. The
plan keeps the bound of the whole search space. Under a profile without the term nothing changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace

import numpy as np

from rec.analysis.build import build_plan
from rec.analysis.predict import lanes_below_widest, predicted_critical_path
from rec.cost.types import SHARDING_TYPES, ST_CODE, CostConfig
from rec.errors import InputError
from rec.search.config import SearchConfig
from rec.search.result import SearchResult
from rec.search.space import SearchSpace
from rec.search.type_costs import RELATIVE_GAIN
from rec.sharding import ShardingType
from rec.spec.types import Spec
from rec.topology.types import Topology

MAX_ROUNDS = 4  # each accepted split searches again; a few suffice for the sharding types there are


def with_split_widths(result: SearchResult, spec: Spec, topology: Topology, cost: CostConfig, config: SearchConfig,
                      search: Callable[[SearchSpace], SearchResult]) -> SearchResult:
    """``result``, or a plan searched with the narrow or the wide tables of a mixed-width kernel
    group kept off its sharding type, whichever is predicted fastest (``search`` searches a space)."""
    if not cost.profile.extensions.widest_dim_multiplier:
        return result

    def value(r: SearchResult) -> float:
        return predicted_critical_path(build_plan(r, spec, topology, cost, config, r.info))

    best, best_value = result, value(result)
    for _ in range(MAX_ROUNDS):
        plan = build_plan(best, spec, topology, cost, config, best.info)
        narrow, wide = lanes_below_widest(plan)  # (T,) bool each, spec order
        st_of_table = plan.columns.sharding_type
        candidates = []
        for code in np.unique(st_of_table[narrow]):
            st = SHARDING_TYPES[int(code)]
            for keep_off in (narrow & (st_of_table == code), wide & (st_of_table == code)):
                space = _without(best.space, keep_off, st)
                if space is None:
                    continue
                try:
                    candidates.append(search(space))
                except InputError:  # they do not fit elsewhere
                    continue
        scored = [(value(c), i, c) for i, c in enumerate(candidates)]
        if not scored or min(scored)[0] >= best_value * (1 - RELATIVE_GAIN):
            break
        best_value, _, best = min(scored)
    if best is result:
        return result
    return replace(best, space=result.space, bound=result.bound, info=result.info)


def _without(space: SearchSpace, tables: np.ndarray, st: ShardingType) -> SearchSpace | None:
    """``space`` with ``tables``' options of ``st`` infeasible; None if one would have none left."""
    opts = space.options
    banned = tables[opts.table] & (opts.sharding_type == ST_CODE[st])
    feasible = space.feasible & ~banned
    covered = np.zeros(space.num_tables, dtype=bool)
    np.logical_or.at(covered, opts.table, feasible)
    return replace(space, feasible=feasible) if covered.all() and banned.any() else None
