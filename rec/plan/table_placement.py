"""Where one table's shards went, as plain values: its module path and name, sharding type and
compute kernel as TorchRec names them, and each shard's offsets, sizes and rank.

What TorchRec's planner chose (``rec.torchrec.score``) and what DistributedModelParallel applied
(``rec.train.applied``) both read as a ``TablePlacement``, so either compares with the other and with
a plan (``rec.train.applied.planned_tables``). Imports no torch: the planning path reads it too.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rec.spec.types import table_key


@dataclass(frozen=True)
class ShardPlacement:
    rank: int | None  # None: a data_parallel replica on every rank
    offsets: tuple[int, ...]  # [row, col]
    sizes: tuple[int, ...]  # [rows, cols]

    def order(self) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
        """Sort key: by rank (a replica on every rank first), then offsets and sizes."""
        return (-1 if self.rank is None else self.rank, self.offsets, self.sizes)

    def to_dict(self) -> dict[str, Any]:
        return {"rank": self.rank, "offsets": list(self.offsets), "sizes": list(self.sizes)}


@dataclass(frozen=True)
class TablePlacement:
    module: str  # the embedding module's path in the model
    name: str
    sharding_type: str  # TorchRec's value ("table_wise", ...)
    compute_kernel: str  # TorchRec's value ("fused", ...)
    shards: tuple[ShardPlacement, ...]

    @property
    def key(self) -> str:
        """The table's identity in a plan (``rec.spec.types.table_key``)."""
        return table_key(self.module, self.name)

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "name": self.name, "sharding_type": self.sharding_type,
                "compute_kernel": self.compute_kernel, "shards": [s.to_dict() for s in self.shards]}
