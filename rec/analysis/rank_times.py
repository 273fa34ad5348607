"""A plan's predicted time per rank under any profile: what ``shardflow measure`` compares with its
measurements, and the model ``shardflow calibrate`` fits.

Per rank, the cost model's ``Perf.total`` of every shard on it (``rec.cost.perf.shard_perf``, the
same formulas the search used; a data_parallel replica counts on every rank), plus the widest-row
term of its kernel groups (``rec.cost.widest``; a profile's extension, 0 by default), plus the profile's
plan-level terms (``Extensions.iteration_ms``, ``sharding_type_ms`` of each sharding type the plan
uses and ``module_sharding_type_ms`` of each further module using it), which are the same on every
rank. Under the plan's own profile the first part is the plan's ``metrics.rank_perf``. Under another
profile it re-rates the same placement, so two profiles can be compared on one plan.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np

from rec.cost.bandwidth import kernel_bw, links
from rec.cost.perf import shard_ids, shard_perf
from rec.cost.tables import kernel_group_keys, table_arrays
from rec.cost.widest import FAMILY_CODE, KERNEL_FAMILY, group_extremes, lanes, padding_ms
from rec.plan.load_factors import chosen_load_factors, unstated_caches
from rec.plan.types import Plan
from rec.profile.types import Profile
from rec.sharding import COMPUTE_KERNELS, SHARDING_TYPES, modules_using


def shard_rank_perf(plan: Plan, profile: Profile | None = None) -> np.ndarray:
    """(W,) ms: each rank's shards under ``profile`` (None: the plan's own), as the search sums them."""
    perf, _ = _entries(plan, profile)
    return _per_rank(plan, perf)


def widest_ms(plan: Plan, profile: Profile | None = None) -> np.ndarray:
    """(W,) ms: each rank's widest-row term (``rec.cost.widest``; zeros at TorchRec's defaults)."""
    profile = plan.planner.profile if profile is None else profile
    if not profile.extensions.widest_dim_multiplier:
        return np.zeros(plan.world_size)
    _, padding = _entries(plan, profile)
    return _per_rank(plan, padding)


def mixes_widths(plan: Plan) -> bool:
    """Whether some kernel group of ``plan`` holds tables of different widths (``rec.cost.widest``)."""
    unit = replace(plan.planner.profile, extensions=replace(plan.planner.profile.extensions, widest_dim_multiplier=1.0))
    return bool(_entries(plan, unit)[1].any())


def _entries(plan: Plan, profile: Profile | None) -> tuple[np.ndarray, np.ndarray]:
    """Per shard (run): its ``Perf.total`` and its widest-row term (zeros where the profile has
    none), ms."""
    profile = plan.planner.profile if profile is None else profile
    spec, topology = plan.spec, plan.topology
    cost = replace(plan.planner.cost, profile=profile)
    arrays = table_arrays(spec, topology.batch_size, cost, chosen_load_factors(plan),
                          world_size=topology.world_size, unstated=unstated_caches(plan))
    hw = links(topology, profile)
    c = plan.columns
    spec_of_table = spec_positions(plan)
    entry_table = c.table_of_entry
    perf, ids, bw = np.zeros(len(entry_table)), np.zeros(len(entry_table)), np.ones(len(entry_table))
    for code in np.unique(c.sharding_type.astype(np.int64) * len(COMPUTE_KERNELS) + c.compute_kernel):
        st, ck = SHARDING_TYPES[code // len(COMPUTE_KERNELS)], COMPUTE_KERNELS[code % len(COMPUTE_KERNELS)]
        mine = np.flatnonzero((c.sharding_type[entry_table] == SHARDING_TYPES.index(st))
                              & (c.compute_kernel[entry_table] == COMPUTE_KERNELS.index(ck)))
        t = spec_of_table[entry_table[mine]]
        lf, miss = arrays.load_factor[t], arrays.miss_rate[t]
        bw[mine] = kernel_bw(hw, profile, KERNEL_FAMILY[ck], lf)  # lanes idle in HBM's kernel
        perf[mine] = shard_perf(st, ck, topology, profile, hw, kernel_bw(hw, profile, ck, lf),
                                c.rows[mine], c.cols[mine],
                                arrays.elem[t], arrays.batch_inputs[t], arrays.priced_outputs[t],
                                pooled=arrays.pooled[t], miss_rate=miss,
                                cache_fetches=arrays.cache_fetches[t], weighted=arrays.weighted[t]).total
        ids[mine] = shard_ids(st, topology.world_size, topology.local_world_size, arrays.batch_inputs[t])
    multiplier = profile.extensions.widest_dim_multiplier
    if not multiplier:
        return perf, np.zeros(len(entry_table))
    t = spec_of_table[entry_table]
    return perf, padding_ms(kernel_groups(plan), ids, c.cols.astype(np.float64), arrays.elem[t], bw, multiplier)


def kernel_groups(plan: Plan) -> np.ndarray:
    """(E,) the kernel group of each shard (run), numbered from 0: TorchRec's TBE on its rank
    (``rec.cost.widest``): its table's ``kernel_group_keys``, its rank, sharding type and kernel family."""
    c = plan.columns
    entry_table = c.table_of_entry
    table_key = kernel_group_keys(plan.spec, plan.planner.cost)[spec_positions(plan)][entry_table]
    rank = np.where(c.replicated[entry_table], -1, c.rank)  # a replica's group is alike on every rank
    family = FAMILY_CODE[c.compute_kernel[entry_table]]
    keys = np.stack([rank, table_key, c.sharding_type[entry_table], family], axis=1)
    group: np.ndarray = np.unique(keys, axis=0, return_inverse=True)[1].reshape(-1)
    return group


def lanes_below_widest(plan: Plan) -> tuple[np.ndarray, np.ndarray]:
    """(T,) bool each, in the plan's table order: the tables with a shard narrower than the widest
    of its kernel group, and those with a shard as wide as the widest of a group that mixes widths
    (widths counted up to 128 columns, as ``rec.cost.widest`` prices them)."""
    c = plan.columns
    group = kernel_groups(plan)
    own = lanes(c.cols)
    narrowest, widest = group_extremes(group, own)
    narrow = np.zeros(len(c), bool)
    wide = np.zeros(len(c), bool)
    np.logical_or.at(narrow, c.table_of_entry, own < widest[group])
    np.logical_or.at(wide, c.table_of_entry, (own == widest[group]) & (narrowest[group] < widest[group]))
    return narrow, wide


def spec_positions(plan: Plan) -> np.ndarray:
    """(T,) each of the plan's tables' position in its spec (``table_arrays``' order)."""
    index = {t.key: i for i, t in enumerate(plan.spec.tables)}
    return np.fromiter((index[key] for key in plan.columns.keys), np.int64, len(plan.columns))


def _per_rank(plan: Plan, per_entry: np.ndarray) -> np.ndarray:
    """(W,) the entries' sum per rank; a data_parallel replica's on every rank."""
    c = plan.columns
    replica = c.replicated[c.table_of_entry]
    on_rank: np.ndarray = np.bincount(c.rank[~replica], weights=per_entry[~replica], minlength=plan.world_size)
    total: np.ndarray = on_rank + per_entry[replica].sum()
    return total


def plan_level_ms(plan: Plan, profile: Profile | None = None) -> float:
    """The profile's plan-level terms for ``plan``: the same on every rank."""
    profile = plan.planner.profile if profile is None else profile
    c = plan.columns
    return profile.extensions.iteration_ms + profile.extensions.type_costs(modules_using(c.sharding_type, c.modules))


def predicted_ms(plan: Plan, profile: Profile | None = None) -> np.ndarray:
    """(W,) ms: the predicted iteration time of every rank under ``profile`` (None: the plan's own)."""
    perf, padding = _entries(plan, profile)
    total: np.ndarray = _per_rank(plan, perf) + _per_rank(plan, padding) + plan_level_ms(plan, profile)
    return total


def predicted_critical_path(plan: Plan) -> float:
    """ms: what an iteration of ``plan`` should take under its own profile: its critical path (with
    the widest-row term, where the profile sets one) plus the profile's plan-level terms
    (``metrics.critical_path`` itself under the default profile)."""
    return plan.metrics.critical_path + widest_excess_ms(plan) + plan_level_ms(plan)


def widest_excess_ms(plan: Plan) -> float:
    """ms the widest-row term adds to the plan's critical path under its own profile (0 without it)."""
    if not plan.planner.profile.extensions.widest_dim_multiplier:
        return 0.0
    rank_perf = np.asarray(plan.metrics.rank_perf, dtype=np.float64)
    return float((rank_perf + widest_ms(plan)).max() - plan.metrics.critical_path)
