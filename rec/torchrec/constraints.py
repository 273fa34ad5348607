"""TorchRec's ``ParameterConstraints`` as spec cells, or refused naming the table and the field.

What a spec holds is mapped as it is: ``sharding_types``, ``compute_kernels`` (allow-lists; the
names shardflow never plans are refused by spec validation, with the alternatives),
``min_partition``, and ``pooling_factors`` (one per feature, or one for every feature). What changes
no estimate passes through to the table's ``ParameterSharding``, as TorchRec's planner passes it:
``cache_params`` (whose ``load_factor`` becomes the table's ``cache_load_factor``, and whose
``stats`` its ``hit_rate_curve`` and its ``distinct_per_batch`` of a global batch, ``stats_cells``),
``enforce_hbm``, ``stochastic_rounding``, ``bounds_check_mode``; ``feature_names`` is TorchRec's
bookkeeping. The rest changes estimates in ways a spec cannot express and is refused unless it holds
TorchRec's default: ``num_poolings``, ``batch_sizes`` other than the planner's batch size,
``output_dtype``, ``device_group`` other than the topology's device,
``key_value_params``, ``use_virtual_table``, and ``cache_params`` with prefetching. ``is_weighted``
is an EmbeddingBagCollection's own (its ``is_weighted()``, which TorchRec's estimator reads before
the constraint) and refused on an EmbeddingCollection's table, which takes no weights.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rec.errors import Problem

# Fields whose value reaches the table's ParameterSharding, as TorchRec's planner copies them.
KERNEL_FIELDS = ("cache_params", "enforce_hbm", "stochastic_rounding", "bounds_check_mode")
SHARE_SLACK = 1e-9  # a miss rate this far outside [0, 1] is float noise (e.g. 1 - a hit rate) and is clipped


@dataclass(frozen=True)
class TableConstraints:
    """One table's constraints as shardflow uses them."""

    cells: dict[str, Any]  # spec cells
    kernel: dict[str, Any]  # ParameterSharding fields (KERNEL_FIELDS) that are set
    load_factor: float | None  # cache_params.load_factor
    stats: Any = None  # cache_params.stats: TorchRec's CacheStatistics, or None


def table_constraints(c: Any, where: str, num_features: int, pooled: bool, batch_size: int,
                      device: str) -> tuple[TableConstraints, list[Problem]]:
    """The spec cells and kernel fields of one table's ``ParameterConstraints`` ``c`` (None: none),
    and what cannot be planned as TorchRec would; ``where`` names the table."""
    from torchrec.distributed.planner.types import ParameterConstraints

    if c is None:  # TorchRec's one input of pooling factor 1.0, however many features
        return TableConstraints({"pooling_factor": 1.0 / num_features} if num_features > 1 else {}, {}, None), []
    if not isinstance(c, ParameterConstraints):
        return TableConstraints({}, {}, None), [Problem(where, f"constraints are a {type(c).__name__}, not "
                                                               "TorchRec's ParameterConstraints")]
    problems: list[Problem] = []
    cells: dict[str, Any] = {}
    if c.sharding_types:
        cells["sharding_types"] = list(c.sharding_types)
    if c.compute_kernels:
        cells["compute_kernels"] = list(c.compute_kernels)
    if c.min_partition:
        cells["min_partition"] = c.min_partition
    factor, why = pooling_factor(list(c.pooling_factors or [1.0]), num_features, pooled)
    if why:
        problems.append(Problem(where, f"pooling_factors {why}"))
    elif factor != 1.0:
        cells["pooling_factor"] = factor
    problems += [Problem(where, reason) for reason in _refused(c, num_features, batch_size, device)]
    if getattr(c, "is_weighted", False) and not pooled:
        problems.append(Problem(where, "is_weighted on an EmbeddingCollection's table: TorchRec prices it as "
                                       "weighted, but an EmbeddingCollection takes no per-id weights"))
    kernel = kernel_fields(c)
    cache = getattr(c, "cache_params", None)
    load_factor = getattr(cache, "load_factor", None) if cache is not None else None
    stats = getattr(cache, "stats", None) if cache is not None else None
    return TableConstraints(cells, kernel, load_factor, stats), problems


def kernel_fields(c: Any) -> dict[str, Any]:
    """The ``ParameterSharding`` fields (``KERNEL_FIELDS``) that constraints ``c`` set (None: none)."""
    return {name: getattr(c, name) for name in KERNEL_FIELDS if getattr(c, name, None) is not None}


def pooling_factor(factors: list[float], num_features: int, pooled: bool = True) -> tuple[float, str | None]:
    """The one pooling factor per feature of a table whose constraints give ``factors`` (one for the
    table, or one per feature), and why there is none that TorchRec's estimates agree with.

    TorchRec counts one input per factor, however many features the table has, and sums
    ``factor x batch`` over them for the ids and ``min(1, factor) x batch`` for a pooled table's
    outputs (an unpooled one outputs its ids). One factor is spread over the features, so that the
    ids are TorchRec's (and the outputs, for a factor up to 1); the mean of one per feature gives
    both sums when the factors lie on one side of 1."""
    if len(factors) == 1:
        return float(factors[0]) / num_features, None
    if len(factors) != num_features:
        return 0.0, (f"lists {len(factors)} values for a table of {num_features} feature"
                     f"{'s' if num_features > 1 else ''}: give one per feature, or one for all")
    if len(set(factors)) == 1:
        return float(factors[0]), None
    if pooled and min(factors) < 1 < max(factors):
        shown = ", ".join(f"{f:g}" for f in factors[:4]) + (", ..." if len(factors) > 4 else "")
        return 0.0, (f"({shown}) lie on both sides of 1: a spec holds one factor per table, and no one factor "
                     "gives TorchRec's ids and outputs both (outputs count min(1, factor) per feature); give "
                     "factors all at least 1 or all at most 1, or one for every feature")
    return sum(factors) / len(factors), None


def _refused(c: Any, num_features: int, batch_size: int, device: str) -> list[str]:
    """What of ``c`` changes TorchRec's estimates in a way a spec cannot express."""
    out = []
    if c.num_poolings and any(x != 1.0 for x in c.num_poolings):
        out.append("num_poolings other than 1.0 is not modelled: shardflow counts one pooling per sample and "
                   "feature")
    if c.batch_sizes and any(b != batch_size for b in c.batch_sizes):
        out.append(f"batch_sizes other than the planner's batch_size {batch_size} are not modelled: every "
                   "feature is planned at batch_size")
    if getattr(c, "output_dtype", None) is not None:
        out.append("output_dtype is not modelled: outputs are counted at the table's data type")
    group = getattr(c, "device_group", None)
    if group is not None and group != device:
        out.append(f"device_group {group!r} is not modelled: shardflow plans every table on the topology's "
                   f"{device} ranks")
    if getattr(c, "key_value_params", None) is not None or getattr(c, "use_virtual_table", False):
        out.append("key-value (SSD or DRAM virtual) tables are not planned: shardflow's topology has no SSD "
                   "tier; use the fused_uvm_caching or fused_uvm kernel")
    cache = getattr(c, "cache_params", None)
    if cache is not None and getattr(cache, "prefetch_pipeline", None):
        out.append("cache_params.prefetch_pipeline is not modelled by shardflow's cost model")
    if cache is not None and getattr(cache, "multipass_prefetch_config", None) is not None:
        out.append("cache_params.multipass_prefetch_config is not modelled by shardflow's cost model")
    return out


def stats_cells(stats: Any, global_batch: int, load_factor: float | None) -> tuple[dict[str, Any], str | None]:
    """The spec cells of TorchRec's ``CacheStatistics`` ``stats`` (None: none), and why there are
    none when ``stats`` cannot give them: ``hit_rate_curve``, its ``expected_miss_rate`` at every
    cache size of the planner's ladder (``CACHE_FRACTIONS``, the cache-size ladder, ``load_factor``,
    1) and every ``STATS_STEP`` of the rows, so that the cost model reads TorchRec's own miss rate
    where it looks, and nearly so between (a cache grown between rungs); and its
    ``expected_lookups``, the distinct ids of a global batch, as ``distinct_per_batch`` counted at
    ``global_batch`` samples. Statistics that raise at some sizes (measured at a few) are read where
    they answer, and the cache's size is fixed (``cache_load_factor``) where TorchRec's proposers keep
    it: at a stated ``load_factor``, else at TorchRec's default size, which the ``ShardingPlan``
    leaves unstated where it can (``unsized_statistics``), as TorchRec's default proposers leave it.
    Never grown to a size where they raise."""
    if stats is None:
        return {}, None
    import math

    from rec.config.cost import UVM_CACHING_RATIO

    fractions = _asked_fractions(load_factor)
    answered, hits, raised = [], [], []
    for fraction in fractions:
        miss = _miss_rate(stats, fraction)
        if isinstance(miss, Exception):  # a user's class: measured at some sizes, say, or broken
            raised.append(f"expected_miss_rate({fraction}) raised {type(miss).__name__}: {miss}")
            continue
        if math.isfinite(miss) and -SHARE_SLACK <= miss <= 1 + SHARE_SLACK:  # a share, up to float noise
            miss = min(max(miss, 0.0), 1.0)
        else:
            return {}, f"expected_miss_rate({fraction}) is {miss!r}, not a share of lookups in [0, 1]"
        answered.append(fraction)
        hits.append(1.0 - miss)
    fixed = None
    if raised:
        fixed = UVM_CACHING_RATIO if load_factor is None else float(load_factor)
        if load_factor is not None and fixed not in answered:  # where TorchRec's estimator asks too
            return {}, next(m for m in raised if m.startswith(f"expected_miss_rate({fixed})"))
        if not answered:
            return {"cache_load_factor": fixed}, None
    # A larger cache serves at least as many lookups: where the user's curve falls again, each size
    # gets the least hit rate of any size from it up, so no size is priced fewer fetches than
    # TorchRec's estimator prices at it (``expected_miss_rate`` as it is).
    points = [[fraction, min(hits[i:])] for i, fraction in enumerate(answered)]
    try:
        lookups = float(stats.expected_lookups)
    except Exception as e:
        return {}, f"expected_lookups raised {type(e).__name__}: {e}"
    if not math.isfinite(lookups) or lookups < 0:
        return {}, f"expected_lookups is {lookups!r}, not a count of distinct ids per batch (>= 0)"
    cells = {"hit_rate_curve": points, "distinct_per_batch": lookups, "stats_batch_size": global_batch}
    return cells if fixed is None else {**cells, "cache_load_factor": fixed}, None


def unsized_statistics(stats: Any, load_factor: float | None, spec_table: Any, beside_sized: bool) -> bool:
    """Whether a table's cache goes without a load factor in the ``ShardingPlan`` although the plan
    fixes its size: statistics (``stats``) that raise at some sizes and no size given
    (``load_factor``), so that ``stats_cells`` fixed the cache at TorchRec's default, which
    TorchRec's default proposers leave unstated. Stated all the same where a cache that may share its
    kernel group has another size (``beside_sized``: FBGEMM would give an unstated one the group's
    mean), unless the statistics raise at the default size, where TorchRec's estimator would ask."""
    from rec.config.cost import UVM_CACHING_RATIO

    if stats is None or load_factor is not None or spec_table.cache_load_factor != UVM_CACHING_RATIO:
        return False
    raises = {fraction: isinstance(_miss_rate(stats, fraction), Exception) for fraction in _asked_fractions(None)}
    if not any(raises.values()):  # not the fallback of stats_cells
        return False
    return not beside_sized or raises[UVM_CACHING_RATIO]


def _miss_rate(stats: Any, fraction: float) -> float | Exception:
    """A user's ``expected_miss_rate(fraction)``, or what it raised."""
    try:
        return float(stats.expected_miss_rate(fraction))
    except Exception as e:
        return e


# Beside the ladder, statistics are asked every half percent of the rows: the planner grows a cache
# between rungs where the next does not fit (``rec.passes.cache_sizes``), and prices it where the
# curve is read between these points (under TorchRec's default profile, only its fetches).
STATS_STEP = 0.005


def _asked_fractions(load_factor: float | None) -> list[float]:
    """The cache sizes ``stats_cells`` asks statistics about, in order."""
    from rec.hit_rates import CACHE_FRACTIONS
    from rec.passes.cache_sizes import LOAD_FACTORS

    grid = (round(i * STATS_STEP, 3) for i in range(1, round(1 / STATS_STEP) + 1))
    return sorted({*CACHE_FRACTIONS, *LOAD_FACTORS, *grid, *(() if load_factor is None else (float(load_factor),))})
