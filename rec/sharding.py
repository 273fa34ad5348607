"""TorchRec's vocabulary for how a table is split and which kernel computes it.

Values are TorchRec's enum values (``ShardingType.TABLE_WISE.value == "table_wise"``), so plans
written by shardflow convert one to one into torchrec objects.
"""

from __future__ import annotations

import functools
from enum import StrEnum


class ShardingType(StrEnum):
    DATA_PARALLEL = "data_parallel"
    TABLE_WISE = "table_wise"
    COLUMN_WISE = "column_wise"
    ROW_WISE = "row_wise"
    TABLE_ROW_WISE = "table_row_wise"
    TABLE_COLUMN_WISE = "table_column_wise"
    GRID_SHARD = "grid_shard"


class ComputeKernel(StrEnum):
    DENSE = "dense"
    FUSED = "fused"
    FUSED_UVM = "fused_uvm"
    FUSED_UVM_CACHING = "fused_uvm_caching"
    KEY_VALUE = "key_value"


class ComputeDevice(StrEnum):
    CPU = "cpu"
    CUDA = "cuda"


FUSED_KERNELS = (ComputeKernel.FUSED, ComputeKernel.FUSED_UVM, ComputeKernel.FUSED_UVM_CACHING)
_MODEL_PARALLEL = (ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.TABLE_COLUMN_WISE)
_CUDA_ONLY = (ShardingType.ROW_WISE, ShardingType.TABLE_ROW_WISE)

# TorchRec names shardflow knows but never plans, and why (spec validation refuses them).
NOT_PLANNED: dict[ShardingType | ComputeKernel, str] = {
    ShardingType.GRID_SHARD: "grid_shard is not planned by shardflow; use table_row_wise, "
                             "column_wise or table_column_wise",
    ComputeKernel.KEY_VALUE: "key_value needs an SSD tier, which shardflow's topology does not "
                             "model; use fused_uvm_caching or fused_uvm",
}


@functools.cache
def sharder_options(device: ComputeDevice) -> dict[ShardingType, tuple[ComputeKernel, ...]]:
    """Sharding types and kernels shardflow plans on ``device``: what TorchRec 1.8's
    ``EmbeddingBagCollectionSharder`` offers for training, minus ``NOT_PLANNED``.

    cpu: data_parallel (dense); table_wise, column_wise, table_column_wise (fused).
    cuda: data_parallel (dense); those three plus row_wise and table_row_wise (fused, fused_uvm,
    fused_uvm_caching)."""
    types: tuple[ShardingType, ...] = (ShardingType.DATA_PARALLEL, *_MODEL_PARALLEL)
    kernels: tuple[ComputeKernel, ...] = (ComputeKernel.FUSED,)
    if device == ComputeDevice.CUDA:
        types += _CUDA_ONLY
        kernels = FUSED_KERNELS
    dense = (ComputeKernel.DENSE,)
    return {st: dense if st == ShardingType.DATA_PARALLEL else kernels for st in types}


def is_available(device: ComputeDevice, sharding_type: ShardingType, kernel: ComputeKernel) -> bool:
    """Whether shardflow plans (and TorchRec trains) ``sharding_type``/``kernel`` on ``device``."""
    return kernel in sharder_options(device).get(sharding_type, ())


class Pooling(StrEnum):
    SUM = "SUM"
    MEAN = "MEAN"


class DataType(StrEnum):
    FP32 = "FP32"
    FP16 = "FP16"
    BF16 = "BF16"
    INT8 = "INT8"
    INT4 = "INT4"
    INT2 = "INT2"

    @property
    def bytes_per_element(self) -> int:
        """Bytes per weight as TorchRec trains the table: ``EmbeddingBagCollection`` allocates FP32
        tables as float32 and every other data type as float16, and its estimators size them so."""
        return 4 if self is DataType.FP32 else 2
