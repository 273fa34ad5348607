"""Whole-plan passes: costs a per-shard search cannot see, dealt with after every search.

The search balances per-shard times (TorchRec's ``Perf``) under per-rank memory. Some costs
depend on the whole plan: a sharding type's collectives cost the same however many tables use it
(``fewer_types``), FBGEMM runs a kernel group at its widest row (``split_widths``), and HBM the plan
leaves free can grow uvm tables' caches (``cache_sizes``). Each is one module with a pass object
(``rec.passes.context.WholePlanPass``: when it applies, what it does to a result); ``PASSES`` runs
them in order. ``plan_spec``, ``replan_spec`` (``rec.planning``) and the drop-in planner, which calls
``plan_spec``, all go through ``after_search``. A new whole-plan term is a module plus a line here.
"""

from __future__ import annotations

from rec.passes.cache_sizes import CacheSizes
from rec.passes.context import PassContext, WholePlanPass
from rec.passes.fewer_types import FewerTypes
from rec.passes.split_widths import SplitWidths
from rec.search.result import SearchResult

PASSES: tuple[WholePlanPass, ...] = (FewerTypes(), SplitWidths(), CacheSizes())

__all__ = ["PASSES", "PassContext", "WholePlanPass", "after_search"]


def after_search(result: SearchResult, context: PassContext) -> SearchResult:
    """``result`` after every pass that applies, in ``PASSES``' order."""
    for step in PASSES:
        if step.applies(context):
            result = step.run(result, context)
    return result
