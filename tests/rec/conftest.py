"""Shared helpers for the library tests."""

from __future__ import annotations

import numpy as np
import pytest

from rec.cost.types import Options
from rec.search.space import build_space
from rec.sharding import CK_CODE, ST_CODE, ComputeKernel, ShardingType


def make_options(tables: list[list[tuple[ShardingType, list[float], list[int]]]]) -> Options:
    """Options from hand-written (sharding type, shard perfs, shard HBM bytes) per table."""
    table, st, ck, start, perf, hbm = [], [], [], [0], [], []
    for t, options in enumerate(tables):
        for sharding_type, perfs, hbms in options:
            table.append(t)
            st.append(ST_CODE[sharding_type])
            ck.append(CK_CODE[ComputeKernel.DENSE if sharding_type is ShardingType.DATA_PARALLEL
                              else ComputeKernel.FUSED])
            perf += perfs
            hbm += hbms
            start.append(len(perf))
    n = len(perf)
    zeros = np.zeros(n, dtype=np.int64)
    return Options(np.array(table, np.int32), np.array(st, np.int8), np.array(ck, np.int8),
                   np.array(start, np.int64), np.array(perf, float), np.array(hbm, np.int64),
                   zeros, zeros, zeros, np.ones(n, np.int64), np.ones(n, np.int64),
                   np.ones(n, np.int32), zeros)


@pytest.fixture
def space_of():
    """Build a SearchSpace from hand-written options on ``world`` ranks of ``hbm_cap`` bytes."""

    def build(tables, world: int, local: int | None = None, hbm_cap: int = 10**12):
        opts = make_options(tables)
        cap = np.full(world, hbm_cap, dtype=np.int64)
        return build_space(opts, len(tables), world, local or world, cap, np.full(world, 10**15))

    return build
