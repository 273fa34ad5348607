"""What DistributedModelParallel applied, read back from the sharded modules (not from the plan it
was given): each table's sharding type and compute kernel, as its lookups are grouped, and its
shards, as its sharded weight lays them out. ``differences`` compares that with a plan.

Reads TorchRec 1.8's sharded EmbeddingBagCollection and EmbeddingCollection (their shardings'
``embedding_tables()``, which list every rank's tables); pinned by tests/rec/test_train_modules.py
and tests/flows/test_own_model.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from torch import nn

from rec.plan.types import Plan
from rec.spec.types import table_key
from rec.torchrec_internals import module_shardings

Shard = tuple[int | None, tuple[int, ...], tuple[int, ...]]  # (rank, offsets, sizes); rank None: every rank


@dataclass(frozen=True)
class AppliedTable:
    module: str  # the embedding module's path in the model
    name: str
    sharding_type: str
    compute_kernel: str
    shards: tuple[Shard, ...]  # sorted; a data_parallel table: one full replica, rank None

    @property
    def key(self) -> str:
        return table_key(self.module, self.name)

    def to_dict(self) -> dict[str, Any]:
        return {"module": self.module, "name": self.name, "sharding_type": self.sharding_type,
                "compute_kernel": self.compute_kernel,
                "shards": [{"rank": r, "offsets": list(o), "sizes": list(s)} for r, o, s in self.shards]}


def applied_tables(model: nn.Module) -> list[AppliedTable]:
    """Every table of every sharded embedding module in ``model`` (a DMP or the module it wraps)."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torchrec.distributed.embedding import ShardedEmbeddingCollection
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection
    from torchrec.distributed.model_parallel import DistributedModelParallel

    root = model.module if isinstance(model, DistributedModelParallel) else model
    out = []
    for path, module in root.named_modules():
        if not isinstance(module, (ShardedEmbeddingCollection, ShardedEmbeddingBagCollection)):
            continue
        shardings = module_shardings(module)
        weights = {key.split(".")[-2]: value for key, value in module.state_dict().items()
                   if key.endswith(".weight")}
        seen = set()
        for sharding_type, sharding in shardings:
            for table in sharding.embedding_tables():
                if table.name in seen:  # a table sharded over ranks is listed once per shard
                    continue
                seen.add(table.name)
                weight = weights[table.name]
                shards: list[Shard]
                if isinstance(weight, ShardedTensor):
                    shards = [(s.placement.rank() if s.placement else None, tuple(s.shard_offsets),
                               tuple(s.shard_sizes)) for s in weight.metadata().shards_metadata]
                else:  # data_parallel: a replica on every rank
                    shards = [(None, (0, 0), tuple(weight.shape))]
                out.append(AppliedTable(path, table.name, sharding_type, table.compute_kernel.value,
                                        tuple(sorted(shards, key=_order))))
    return out


def planned_tables(plan: Plan) -> list[AppliedTable]:
    """The plan's tables in the same form, to compare with ``applied_tables``."""
    out = []
    for t in plan.tables:
        shards: list[Shard] = ([(None, (0, 0), tuple(t.shards[0].sizes))] if t.replicated else
                               [(s.rank, tuple(s.offsets), tuple(s.sizes)) for s in t.shards])
        out.append(AppliedTable(t.module, t.name, t.sharding_type.value, t.compute_kernel.value,
                                tuple(sorted(shards, key=_order))))
    return out


def differences(plan: Plan, applied: list[AppliedTable]) -> list[str]:
    """One line per table whose applied sharding is not the planned one (empty: exactly as planned)."""
    planned = {t.key: t for t in planned_tables(plan)}
    got = {t.key: t for t in applied}
    out = [f"{key}: planned, not sharded" for key in planned if key not in got]
    out += [f"{key}: sharded, not planned" for key in got if key not in planned]
    for key in planned.keys() & got.keys():
        p, a = planned[key], got[key]
        if p != a:
            out.append(f"{key}: planned {p.sharding_type}/{p.compute_kernel} {list(p.shards)}, "
                       f"applied {a.sharding_type}/{a.compute_kernel} {list(a.shards)}")
    return sorted(out)


def applied_sharding(model: nn.Module) -> dict[str, str]:
    """Sharding type per table key as the sharded modules report it (``train_metrics.json``)."""
    return {t.key: t.sharding_type for t in applied_tables(model)}


def _order(shard: Shard) -> tuple[int, tuple[int, ...], tuple[int, ...]]:
    rank, offsets, sizes = shard
    return (-1 if rank is None else rank, offsets, sizes)
