"""Where the shards of each sharding type may go, as TorchRec's GreedyPerfPartitioner places them."""

from __future__ import annotations

from enum import Enum

import numpy as np

from rec.cost.types import SHARDING_TYPES
from rec.sharding import ShardingType


class Placement(Enum):
    EVERY_RANK = "every_rank"  # data_parallel, row_wise: shard i on rank i ("uniform")
    HOST_UNIFORM = "host_uniform"  # table_row_wise: shard j on rank j of one host
    HOST_FREE = "host_free"  # table_column_wise: every shard on some rank of one host
    FREE = "free"  # table_wise, column_wise: every shard on any rank ("device")


PLACEMENT = {
    ShardingType.DATA_PARALLEL: Placement.EVERY_RANK,
    ShardingType.ROW_WISE: Placement.EVERY_RANK,
    ShardingType.TABLE_ROW_WISE: Placement.HOST_UNIFORM,
    ShardingType.GRID_SHARD: Placement.HOST_UNIFORM,
    ShardingType.TABLE_COLUMN_WISE: Placement.HOST_FREE,
    ShardingType.TABLE_WISE: Placement.FREE,
    ShardingType.COLUMN_WISE: Placement.FREE,
}

# Placement per sharding-type code, for vectorized lookups.
PLACEMENT_BY_CODE = np.array([list(Placement).index(PLACEMENT[st]) for st in SHARDING_TYPES])


def placement_codes(sharding_type_codes: np.ndarray) -> np.ndarray:
    """Placement index (position in ``list(Placement)``) for each sharding-type code."""
    return PLACEMENT_BY_CODE[sharding_type_codes]


EVERY_RANK, HOST_UNIFORM, HOST_FREE, FREE = range(4)
