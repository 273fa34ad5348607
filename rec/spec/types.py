"""Typed, immutable table specs (names follow TorchRec's EmbeddingBagConfig/ParameterConstraints)."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import TYPE_CHECKING

from rec.sharding import ComputeKernel, DataType, ModuleKind, Pooling, ShardingType

if TYPE_CHECKING:
    from rec.config.cost import Optimizer

# The module a table without ``module`` belongs to: the EmbeddingBagCollection of shardflow's own
# training model (DLRMTrain -> DLRM -> SparseArch), so every spec written before modules existed
# means what it meant.
DEFAULT_MODULE = "model.sparse_arch.embedding_bag_collection"


def table_key(module: str, name: str) -> str:
    """A table's identity in a spec and a plan: its name in ``DEFAULT_MODULE``, ``module.name`` in
    any other module. Table names hold no '.', so the key splits back at its last '.'."""
    return name if module == DEFAULT_MODULE else f"{module}.{name}"


def row_key(row: dict[str, object]) -> str:
    """``table_key`` of a spec row as ``columns.table_to_row`` writes it (a plan's ``spec``)."""
    return table_key(str(row.get("module") or DEFAULT_MODULE), str(row.get("name")))


@dataclass(frozen=True)
class TableSpec:
    name: str
    num_embeddings: int
    embedding_dim: int
    feature_names: tuple[str, ...]
    pooling: Pooling = Pooling.SUM
    data_type: DataType = DataType.FP32
    pooling_factor: float = 1.0
    sharding_types: tuple[ShardingType, ...] | None = None
    compute_kernels: tuple[ComputeKernel, ...] | None = None
    module: str = DEFAULT_MODULE  # fully qualified name of the embedding module in the model
    min_partition: int | None = None  # TorchRec's ParameterConstraints.min_partition: column shards' least width
    # Measured from training data (``shardflow spec stats``, rec.data.stats); None where not measured.
    stats_rows: int | None = None  # samples the statistics were measured on
    stats_batch_size: int | None = None  # the batch size distinct_per_batch was counted at
    distinct_per_batch: float | None = None  # mean distinct ids in a batch, all the table's features together
    ids_out_of_range: int | None = None  # sampled ids outside [0, num_embeddings)
    hit_rate_curve: tuple[tuple[float, float], ...] | None = None  # (cache fraction of rows, share of lookups)
    # TorchRec's CacheParams.load_factor: the share of the rows a fused_uvm_caching cache holds, fixed
    # by the user; None: the planner chooses it (rec.passes.cache_sizes).
    cache_load_factor: float | None = None
    # TorchRec's EmbeddingBagCollection(is_weighted=True): each id comes with a weight (id-score lists),
    # the pooled vector is the weighted sum or mean. Every table of a module agrees.
    is_weighted: bool = False
    # The least share of the rows a fused_uvm_caching cache holds; the planner chooses the size from
    # there up, as TorchRec's EmbeddingOffloadScaleupProposer takes a stated load factor beside
    # statistics. None: no floor.
    min_cache_load_factor: float | None = None
    # The optimizer whose state the storage estimate adds to this table's shards, where it is not the
    # cost model's (``CostConfig.optimizer``): TorchRec reads each table's from its weight, which
    # ``apply_optimizer_in_backward`` marked. None: the cost model's. (Last: the columnar reader builds
    # tables positionally.)
    optimizer: Optimizer | None = None

    @property
    def bytes(self) -> float:
        """Size of the embedding weights alone."""
        return self.num_embeddings * self.embedding_dim * self.data_type.bytes_per_element

    @property
    def key(self) -> str:
        """The table's identity (``table_key``): unique in a spec."""
        return table_key(self.module, self.name)

    @property
    def pooled(self) -> bool:
        return self.pooling is not Pooling.NONE


@dataclass(frozen=True)
class Spec:
    """A validated table spec. ``spec_hash`` ignores file format and row order."""

    tables: tuple[TableSpec, ...]
    spec_hash: str

    def __len__(self) -> int:
        return len(self.tables)

    @property
    def names(self) -> list[str]:
        return [t.name for t in self.tables]

    @property
    def keys(self) -> list[str]:
        """Every table's ``key``, in spec order."""
        return [t.key for t in self.tables]

    @functools.cached_property
    def modules(self) -> dict[str, ModuleKind]:
        """Each embedding module's path and kind, in model order: the order TorchRec walks a model
        whose submodules were created in the order the spec first names them (``model_order``)."""
        kinds: dict[str, ModuleKind] = {}
        for t in self.tables:
            kinds.setdefault(t.module, t.pooling.module_kind)
        return {path: kinds[path] for path in model_order(list(kinds))}


def model_order(paths: list[str]) -> list[str]:
    """``paths`` as ``named_modules()`` lists them in a model built by creating each path's
    submodules in the order of ``paths``: depth first, siblings in order of creation."""
    created: dict[tuple[str, ...], int] = {}
    keys = []
    for path in paths:
        parts = tuple(path.split("."))
        keys.append([created.setdefault(parts[:i + 1], len(created)) for i in range(len(parts))])
    return [path for _, path in sorted(zip(keys, paths, strict=True))]
