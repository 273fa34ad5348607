"""A plan's predicted time per rank under any profile: what ``shardflow measure`` compares with its
measurements, and the model ``shardflow calibrate`` fits.

Per rank, the cost model's ``Perf.total`` of every shard on it (``rec.cost.perf.shard_perf``, the
same formulas the search used; a data_parallel replica counts on every rank), plus the profile's
plan-level terms (``Extensions.iteration_ms`` and ``sharding_type_ms`` of each sharding type the
plan uses), which are the same on every rank. Under the plan's own profile the first part is the
plan's ``metrics.rank_perf``. Under another profile it re-rates the same placement, so two profiles
can be compared on one plan.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from rec.cost.bandwidth import kernel_bw, links
from rec.cost.perf import shard_perf
from rec.cost.tables import table_arrays
from rec.cost.types import COMPUTE_KERNELS, SHARDING_TYPES
from rec.plan.types import Plan
from rec.profile.types import Profile


def shard_rank_perf(plan: Plan, profile: Profile | None = None) -> np.ndarray:
    """(W,) ms: each rank's shards under ``profile`` (None: the plan's own), as the search sums them."""
    profile = plan.planner.profile if profile is None else profile
    spec, topology = plan.spec, plan.topology
    cost = replace(plan.planner.cost, profile=profile)
    arrays = table_arrays(spec, topology.batch_size, cost)
    hw = links(topology, profile)
    c = plan.columns
    index = {t.key: i for i, t in enumerate(spec.tables)}
    spec_of_table = np.fromiter((index[key] for key in c.keys), np.int64, len(c))
    entry_table = c.table_of_entry
    perf = np.zeros(len(entry_table))
    for code in np.unique(c.sharding_type.astype(np.int64) * len(COMPUTE_KERNELS) + c.compute_kernel):
        st, ck = SHARDING_TYPES[code // len(COMPUTE_KERNELS)], COMPUTE_KERNELS[code % len(COMPUTE_KERNELS)]
        mine = np.flatnonzero((c.sharding_type[entry_table] == SHARDING_TYPES.index(st))
                              & (c.compute_kernel[entry_table] == COMPUTE_KERNELS.index(ck)))
        t = spec_of_table[entry_table[mine]]
        perf[mine] = shard_perf(st, ck, topology, profile, hw, kernel_bw(hw, profile, ck, cost.caching_ratio),
                                c.rows[mine], c.cols[mine], arrays.elem[t], arrays.batch_inputs[t],
                                arrays.batch_outputs[t], pooled=arrays.pooled[t]).total
    replica = c.replicated[entry_table]
    on_rank: np.ndarray = np.bincount(c.rank[~replica], weights=perf[~replica], minlength=plan.world_size)
    total: np.ndarray = on_rank + perf[replica].sum()
    return total


def plan_level_ms(plan: Plan, profile: Profile | None = None) -> float:
    """The profile's plan-level terms for ``plan``: the same on every rank."""
    profile = plan.planner.profile if profile is None else profile
    x = profile.extensions
    used = {SHARDING_TYPES[int(code)] for code in np.unique(plan.columns.sharding_type)}
    return x.iteration_ms + sum(x.sharding_type_cost(st) for st in sorted(used))


def predicted_ms(plan: Plan, profile: Profile | None = None) -> np.ndarray:
    """(W,) ms: the predicted iteration time of every rank under ``profile`` (None: the plan's own)."""
    total: np.ndarray = shard_rank_perf(plan, profile) + plan_level_ms(plan, profile)
    return total


def predicted_critical_path(plan: Plan) -> float:
    """ms: what an iteration of ``plan`` should take under its own profile: its critical path plus
    the profile's plan-level terms (``metrics.critical_path`` itself under the default profile)."""
    return plan.metrics.critical_path + plan_level_ms(plan)
