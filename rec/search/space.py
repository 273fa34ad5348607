"""The search space: candidate options, their aggregate costs and the ranks' capacities."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rec.cost.types import Options
from rec.search.placement import EVERY_RANK, HOST_UNIFORM, placement_codes


@dataclass(frozen=True)
class SearchSpace:
    """Everything the search reads; immutable and cheap to ship to a Ray actor."""

    options: Options
    num_tables: int
    world_size: int
    local_world_size: int
    hbm_cap: np.ndarray  # (W,) bytes usable per rank after the storage reservation
    ddr_cap: np.ndarray  # (W,)
    work: np.ndarray  # (O,) sum of shard perf: what the option adds to all ranks together
    max_shard: np.ndarray  # (O,) largest single shard perf of the option
    placement: np.ndarray  # (O,) placement code
    feasible: np.ndarray  # (O,) bool: every shard fits on a rank it may go to

    @property
    def num_hosts(self) -> int:
        return self.world_size // self.local_world_size


def build_space(options: Options, num_tables: int, world_size: int, local_world_size: int,
                hbm_cap: np.ndarray, ddr_cap: np.ndarray) -> SearchSpace:
    """Aggregate per-option costs and mark options whose shards cannot fit anywhere."""
    starts = options.shard_start[:-1]
    work = np.add.reduceat(options.perf, starts) if len(starts) else np.zeros(0)
    max_shard = np.maximum.reduceat(options.perf, starts) if len(starts) else np.zeros(0)
    placement = placement_codes(options.sharding_type)
    feasible = _feasible(options, placement, world_size, local_world_size, hbm_cap, ddr_cap)
    return SearchSpace(options, num_tables, world_size, local_world_size,
                       np.asarray(hbm_cap, dtype=np.int64), np.asarray(ddr_cap, dtype=np.int64),
                       work, max_shard, placement, feasible)


def _feasible(options: Options, placement: np.ndarray, world_size: int, local_world_size: int,
              hbm_cap: np.ndarray, ddr_cap: np.ndarray) -> np.ndarray:
    num_shards = options.num_shards()
    owner = np.repeat(np.arange(options.num_options), num_shards)
    position = np.arange(len(options.perf)) - np.repeat(options.shard_start[:-1], num_shards)
    shard_placement = placement[owner]
    # Fixed-position shards must fit their rank (any host for host-bound ones); free shards the
    # largest rank.
    rank = np.where(shard_placement == EVERY_RANK, position % world_size, 0)
    fixed = shard_placement == EVERY_RANK
    host_uniform = shard_placement == HOST_UNIFORM
    hbm_limit = np.where(fixed, hbm_cap[rank], hbm_cap.max())
    ddr_limit = np.where(fixed, ddr_cap[rank], ddr_cap.max())
    if host_uniform.any():
        by_local = np.asarray(hbm_cap).reshape(-1, local_world_size).max(axis=0)
        ddr_by_local = np.asarray(ddr_cap).reshape(-1, local_world_size).max(axis=0)
        local = position % local_world_size
        hbm_limit = np.where(host_uniform, by_local[local], hbm_limit)
        ddr_limit = np.where(host_uniform, ddr_by_local[local], ddr_limit)
    fits = (options.hbm <= hbm_limit) & (options.ddr <= ddr_limit)
    bad = np.bincount(owner[~fits], minlength=options.num_options)
    return bad == 0
