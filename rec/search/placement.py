"""Where the shards of each sharding type may go, as TorchRec's GreedyPerfPartitioner places them."""

from __future__ import annotations

from enum import IntEnum

import numpy as np

from rec.sharding import SHARDING_TYPES, ShardingType


class Placement(IntEnum):
    """Placement rule of an option's shards; the values are the codes in ``SearchSpace.placement``."""

    EVERY_RANK = 0  # data_parallel, row_wise: shard i on rank i ("uniform")
    HOST_UNIFORM = 1  # table_row_wise, grid_shard: shard j on rank j of one host
    HOST_FREE = 2  # table_column_wise: every shard on some rank of one host
    FREE = 3  # table_wise, column_wise: every shard on any rank ("device")


PLACEMENT = {
    ShardingType.DATA_PARALLEL: Placement.EVERY_RANK,
    ShardingType.ROW_WISE: Placement.EVERY_RANK,
    ShardingType.TABLE_ROW_WISE: Placement.HOST_UNIFORM,
    ShardingType.GRID_SHARD: Placement.HOST_UNIFORM,
    ShardingType.TABLE_COLUMN_WISE: Placement.HOST_FREE,
    ShardingType.TABLE_WISE: Placement.FREE,
    ShardingType.COLUMN_WISE: Placement.FREE,
}

_BY_CODE = np.array([PLACEMENT[st] for st in SHARDING_TYPES], dtype=np.int8)


def placement_codes(sharding_type_codes: np.ndarray) -> np.ndarray:
    """``Placement`` value for each sharding-type code."""
    return np.asarray(_BY_CODE[sharding_type_codes])


def movable(placement: np.ndarray) -> np.ndarray:
    """Whether shards of these placements may go to a rank of the search's choosing."""
    return np.asarray((placement == Placement.FREE) | (placement == Placement.HOST_FREE))
