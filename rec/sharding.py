"""TorchRec's vocabulary for how a table is split and which kernel computes it.

Values are TorchRec's enum values (``ShardingType.TABLE_WISE.value == "table_wise"``), so plans
written by shardflow convert one to one into torchrec objects.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from enum import StrEnum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import numpy as np


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


# Integer codes of the search's and the plan's arrays (rec.cost.types.Options, rec.plan.columns):
# a member's position in its enum, so the order never changes (codes are persisted nowhere).
SHARDING_TYPES: tuple[ShardingType, ...] = tuple(ShardingType)
COMPUTE_KERNELS: tuple[ComputeKernel, ...] = tuple(ComputeKernel)
ST_CODE = {st: i for i, st in enumerate(SHARDING_TYPES)}
CK_CODE = {ck: i for i, ck in enumerate(COMPUTE_KERNELS)}

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


class ModuleKind(StrEnum):
    """The TorchRec module that holds a table, named by its class: it decides the sharder."""

    EMBEDDING_BAG_COLLECTION = "EmbeddingBagCollection"  # pooled (SUM/MEAN): one vector per bag
    EMBEDDING_COLLECTION = "EmbeddingCollection"  # unpooled (pooling NONE): one vector per id

    @property
    def sharder(self) -> str:
        """TorchRec's sharder class for the module (``EmbeddingBagCollectionSharder``, ...)."""
        return f"{self.value}Sharder"


_EC_TYPES = (ShardingType.DATA_PARALLEL, ShardingType.TABLE_WISE, ShardingType.COLUMN_WISE, ShardingType.ROW_WISE)


@functools.cache
def sharder_options(device: ComputeDevice, kind: ModuleKind = ModuleKind.EMBEDDING_BAG_COLLECTION
                    ) -> dict[ShardingType, tuple[ComputeKernel, ...]]:
    """Sharding types and kernels shardflow plans on ``device`` for a ``kind`` module: what TorchRec
    1.8's sharder of that module offers for training, minus ``NOT_PLANNED``.

    EmbeddingBagCollectionSharder, cpu: data_parallel (dense); table_wise, column_wise,
    table_column_wise (fused). cuda: data_parallel (dense); those three plus row_wise and
    table_row_wise (fused, fused_uvm, fused_uvm_caching).
    EmbeddingCollectionSharder, cuda: data_parallel (dense); table_wise, column_wise and row_wise
    (fused, fused_uvm, fused_uvm_caching). cpu: table_wise, column_wise and row_wise (fused); not
    data_parallel, which TorchRec offers but cannot train there."""
    types: tuple[ShardingType, ...] = (ShardingType.DATA_PARALLEL, *_MODEL_PARALLEL)
    kernels: tuple[ComputeKernel, ...] = (ComputeKernel.FUSED,)
    if device == ComputeDevice.CUDA:
        types += _CUDA_ONLY
        kernels = FUSED_KERNELS
    if kind is ModuleKind.EMBEDDING_COLLECTION:
        # TorchRec offers data_parallel on cpu too, but there its dense kernel returns one row per bag,
        # not per id, and the job fails ("split_with_sizes expects ...", TorchRec issue 1255).
        types = _EC_TYPES if device == ComputeDevice.CUDA else _EC_TYPES[1:]
    dense = (ComputeKernel.DENSE,)
    return {st: dense if st == ShardingType.DATA_PARALLEL else kernels for st in types}


@functools.cache
def offered(kind: ModuleKind) -> tuple[frozenset[ShardingType], frozenset[ComputeKernel]]:
    """The sharding types and kernels ``kind``'s sharder offers on some device (what a spec may
    allow-list for a table of that module)."""
    options = [sharder_options(device, kind) for device in ComputeDevice]
    return (frozenset(st for o in options for st in o),
            frozenset(ck for o in options for kernels in o.values() for ck in kernels))


def is_available(device: ComputeDevice, sharding_type: ShardingType, kernel: ComputeKernel,
                 kind: ModuleKind = ModuleKind.EMBEDDING_BAG_COLLECTION) -> bool:
    """Whether shardflow plans (and TorchRec trains) ``sharding_type``/``kernel`` on ``device`` for
    a table of a ``kind`` module."""
    return kernel in sharder_options(device, kind).get(sharding_type, ())


class Pooling(StrEnum):
    SUM = "SUM"
    MEAN = "MEAN"
    NONE = "NONE"  # unpooled: the table of an EmbeddingCollection

    @property
    def module_kind(self) -> ModuleKind:
        """The module a table of this pooling lives in."""
        return ModuleKind.EMBEDDING_COLLECTION if self is Pooling.NONE else ModuleKind.EMBEDDING_BAG_COLLECTION


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


def modules_using(sharding_type: Sequence[int] | np.ndarray, modules: Sequence[str]) -> dict[ShardingType, int]:
    """How many embedding modules each sharding type serves, given each table's type code
    (``SHARDING_TYPES`` index) and module."""
    codes = sharding_type.tolist() if hasattr(sharding_type, "tolist") else list(sharding_type)
    out: dict[ShardingType, int] = {}
    for code, _ in set(zip(codes, modules, strict=True)):
        out[SHARDING_TYPES[int(code)]] = out.get(SHARDING_TYPES[int(code)], 0) + 1
    return out
