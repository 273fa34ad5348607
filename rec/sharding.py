"""TorchRec's vocabulary for how a table is split and which kernel computes it.

Values are TorchRec's enum values (``ShardingType.TABLE_WISE.value == "table_wise"``), so plans
written by shardflow convert one to one into torchrec objects.
"""

from __future__ import annotations

from enum import Enum


class ShardingType(str, Enum):
    DATA_PARALLEL = "data_parallel"
    TABLE_WISE = "table_wise"
    COLUMN_WISE = "column_wise"
    ROW_WISE = "row_wise"
    TABLE_ROW_WISE = "table_row_wise"
    TABLE_COLUMN_WISE = "table_column_wise"
    GRID_SHARD = "grid_shard"


class ComputeKernel(str, Enum):
    DENSE = "dense"
    FUSED = "fused"
    FUSED_UVM = "fused_uvm"
    FUSED_UVM_CACHING = "fused_uvm_caching"
    KEY_VALUE = "key_value"


class ComputeDevice(str, Enum):
    CPU = "cpu"
    CUDA = "cuda"


class Pooling(str, Enum):
    SUM = "SUM"
    MEAN = "MEAN"


class DataType(str, Enum):
    FP32 = "FP32"
    FP16 = "FP16"
    BF16 = "BF16"
    INT8 = "INT8"
    INT4 = "INT4"
    INT2 = "INT2"

    @property
    def bytes_per_element(self) -> float:
        return _BYTES[self]


_BYTES = {
    DataType.FP32: 4.0,
    DataType.FP16: 2.0,
    DataType.BF16: 2.0,
    DataType.INT8: 1.0,
    DataType.INT4: 0.5,
    DataType.INT2: 0.25,
}
