"""Plans under a profile whose sharding types cost time per iteration (``sharding_type_ms``, and
``module_sharding_type_ms`` per further embedding module using a type).

A sharding type's collectives cost the same whether it holds one table or a hundred (once per module
using it: ``rec.analysis.rank_times``): a plan-level term, invisible to a search that balances per-shard times.
So a plan can use one more sharding type for a slightly better balance and lose more than it
gains. After the search, each costly type the plan uses is taken away in turn (its options made
infeasible) and the rest searched again; a plan that is better with the plan-level terms counted
replaces the first, and the same is tried on it, until taking a type away no longer helps. Every
table keeps some option, or the type stays. The plan keeps the bound of the whole search space,
which holds for any plan in it. Under a profile without such terms (TorchRec's default) nothing
changes.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

import numpy as np

from rec.errors import InputError
from rec.passes.context import RELATIVE_GAIN, PassContext
from rec.profile.types import Profile
from rec.search.result import SearchResult
from rec.search.space import SearchSpace, without_options
from rec.sharding import ST_CODE, ShardingType, modules_using


def with_fewer_types(result: SearchResult, profile: Profile, search: Callable[[SearchSpace], SearchResult],
                     modules: Sequence[str]) -> SearchResult:
    """``result``, or the plan with fewer costly sharding types whose critical path plus their
    ``sharding_type_ms`` (and ``module_sharding_type_ms`` for each further module of ``modules``,
    each table's, using them) is lowest (``search`` searches a space)."""
    costs = profile.extensions
    if not costs.prices_types:
        return result
    full = result.space
    best, best_value, removed = result, _value(result, profile, modules), set[ShardingType]()
    while True:
        cost = {st: costs.type_costs({st: n}) for st, n in _modules_using(best, modules).items()}
        tried = [st for st in sorted(cost, key=lambda st: (-cost[st], st.value)) if cost[st] > 0]
        for st in tried:
            space = _without(full, removed | {st})
            if space is None:
                continue
            try:
                candidate = search(space)
            except InputError:  # the tables do not fit without it
                continue
            value = _value(candidate, profile, modules)
            if value < best_value * (1 - RELATIVE_GAIN):
                best, best_value = candidate, value
                removed.add(st)
                break
        else:
            break
    if best is result:
        return result
    return replace(best, space=full, bound=result.bound, info=result.info)


def _modules_using(result: SearchResult, modules: Sequence[str]) -> dict[ShardingType, int]:
    """How many modules each sharding type of the plan serves (``modules``: each table's)."""
    return modules_using(result.space.options.sharding_type[result.assignment.choice], modules)


def _value(result: SearchResult, profile: Profile, modules: Sequence[str]) -> float:
    """The critical path with the plan-level terms of the types the plan uses."""
    return result.critical_path + profile.extensions.type_costs(_modules_using(result, modules))


def _without(space: SearchSpace, types: set[ShardingType]) -> SearchSpace | None:
    """``space`` with the options of ``types`` infeasible; None if a table would have none left."""
    return without_options(space, np.isin(space.options.sharding_type, [ST_CODE[st] for st in types]))


class FewerTypes:
    """``with_fewer_types`` as a whole-plan pass: under a profile with ``sharding_type_ms`` or
    ``module_sharding_type_ms``."""

    def applies(self, context: PassContext) -> bool:
        return context.cost.profile.extensions.prices_types and context.search is not None

    def run(self, result: SearchResult, context: PassContext) -> SearchResult:
        assert context.search is not None
        return with_fewer_types(result, context.cost.profile, context.search,
                                [t.module for t in context.spec.tables])
