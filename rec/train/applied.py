"""What DistributedModelParallel applied, read back from the sharded modules (not from the plan it
was given): each table's sharding type and compute kernel, as its lookups are grouped, and its
shards, as its sharded weight lays them out, each table a ``rec.plan.table_placement.TablePlacement``.
``differences`` compares that with a plan.

Reads TorchRec 1.8's sharded EmbeddingBagCollection and EmbeddingCollection (their shardings'
``embedding_tables()``, which list every rank's tables); pinned by tests/rec/test_train_modules.py
and tests/flows/test_own_model.py.
"""

from __future__ import annotations

from torch import nn

from rec.plan.table_placement import ShardPlacement, TablePlacement
from rec.plan.types import Plan
from rec.torchrec_internals import module_shardings


def applied_tables(model: nn.Module) -> list[TablePlacement]:
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
                shards: list[ShardPlacement]
                if isinstance(weight, ShardedTensor):
                    shards = [ShardPlacement(s.placement.rank() if s.placement else None, tuple(s.shard_offsets),
                                             tuple(s.shard_sizes)) for s in weight.metadata().shards_metadata]
                else:  # data_parallel: a replica on every rank
                    shards = [ShardPlacement(None, (0, 0), tuple(weight.shape))]
                out.append(TablePlacement(path, table.name, sharding_type, table.compute_kernel.value,
                                          tuple(sorted(shards, key=ShardPlacement.order))))
    return out


def planned_tables(plan: Plan) -> list[TablePlacement]:
    """The plan's tables in the same form, to compare with ``applied_tables``."""
    out = []
    for t in plan.tables:
        shards = ([ShardPlacement(None, (0, 0), tuple(t.shards[0].sizes))] if t.replicated else
                  [ShardPlacement(s.rank, tuple(s.offsets), tuple(s.sizes)) for s in t.shards])
        out.append(TablePlacement(t.module, t.name, t.sharding_type.value, t.compute_kernel.value,
                                  tuple(sorted(shards, key=ShardPlacement.order))))
    return out


def differences(plan: Plan, applied: list[TablePlacement]) -> list[str]:
    """One line per table whose applied sharding is not the planned one (empty: exactly as planned)."""
    planned = {t.key: t for t in planned_tables(plan)}
    got = {t.key: t for t in applied}
    out = [f"{key}: planned, not sharded" for key in planned if key not in got]
    out += [f"{key}: sharded, not planned" for key in got if key not in planned]
    for key in planned.keys() & got.keys():
        p, a = planned[key], got[key]
        if p != a:
            out.append(f"{key}: planned {p.sharding_type}/{p.compute_kernel} {_listed(p.shards)}, "
                       f"applied {a.sharding_type}/{a.compute_kernel} {_listed(a.shards)}")
    return sorted(out)


def applied_sharding(model: nn.Module) -> dict[str, str]:
    """Sharding type per table key as the sharded modules report it (``train_metrics.json``)."""
    return {t.key: t.sharding_type for t in applied_tables(model)}


def _listed(shards: tuple[ShardPlacement, ...]) -> list[tuple[int | None, tuple[int, ...], tuple[int, ...]]]:
    return [(s.rank, s.offsets, s.sizes) for s in shards]
