"""Typed, immutable table specs (names follow TorchRec's EmbeddingBagConfig/ParameterConstraints)."""

from __future__ import annotations

from dataclasses import dataclass

from rec.sharding import ComputeKernel, DataType, Pooling, ShardingType


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

    @property
    def bytes(self) -> float:
        """Size of the embedding weights alone."""
        return self.num_embeddings * self.embedding_dim * self.data_type.bytes_per_element


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
