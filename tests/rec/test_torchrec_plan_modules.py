"""A plan for a whole model: DistributedModelParallel, given ``to_sharding_plan`` and ``sharders_for``,
shards every EmbeddingBagCollection and EmbeddingCollection of the model exactly as planned (read back
from the sharded modules and their sharded weights, not from the plan)."""

from __future__ import annotations

import pytest

from rec.plan import read_plan, write_plan
from rec.plan.torchrec_plan import module_sharding_plan, plan_modules, sharders_for, to_sharding_plan
from rec.planning import plan_spec
from rec.sharding import ModuleKind, ShardingType
from rec.spec import spec_from_rows
from rec.spec.types import DEFAULT_MODULE
from rec.topology import topology_from_dict

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

from torch import nn  # noqa: E402

USER = "towers.user.ebc"
SEQUENCE = "sequence.blocks.0.ec"
ROWS = [
    dict(name="id", num_embeddings=100, embedding_dim=16, module=USER, sharding_types=["table_wise"]),
    dict(name="geo", num_embeddings=1000, embedding_dim=256, pooling="MEAN", module=USER,
         sharding_types=["column_wise"]),
    dict(name="age", num_embeddings=50, embedding_dim=8, module=USER, sharding_types=["data_parallel"]),
    # An EmbeddingCollection: unpooled, one dim; a table named as one of the EBC's (another module).
    dict(name="id", num_embeddings=500, embedding_dim=32, pooling="NONE", module=SEQUENCE, feature_names=["item"],
         sharding_types=["row_wise"]),
    dict(name="history", num_embeddings=300, embedding_dim=32, pooling="NONE", module=SEQUENCE,
         sharding_types=["table_wise"]),
    dict(name="query", num_embeddings=40, embedding_dim=32, pooling="NONE", module=SEQUENCE,
         sharding_types=["column_wise"]),
]


class TwoTowerModel(nn.Module):
    """A user's model: an EBC and an EC at different nested paths, dense layers beside them."""

    def __init__(self, spec) -> None:
        from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

        from rec.spec.torchrec_modules import embedding_configs

        super().__init__()
        meta = torch.device("meta")
        self.towers = nn.Module()
        self.towers.user = nn.Module()
        self.towers.user.ebc = EmbeddingBagCollection(
            embedding_configs([t for t in spec.tables if t.module == USER]), device=meta)
        self.towers.user.mlp = nn.Linear(16 + 256 + 8, 4)
        self.sequence = nn.Module()
        self.sequence.blocks = nn.ModuleList([nn.Module()])
        self.sequence.blocks[0].ec = EmbeddingCollection(
            embedding_configs([t for t in spec.tables if t.module == SEQUENCE]), device=meta)


@pytest.fixture
def plan(tmp_path):
    spec = spec_from_rows(ROWS)
    topology = topology_from_dict(dict(world_size=1, compute_device="cpu", ddr_cap="4GiB"))
    write_plan(plan_spec(spec, topology), tmp_path / "plan")
    return read_plan(tmp_path / "plan")  # what a user's script does: the plan as written


def applied(model: nn.Module) -> dict[tuple[str, str], tuple[str, list]]:
    """(module path, table) -> (sharding type, [(rank, offsets, sizes)]) from the sharded modules: the
    sharding each table's lookup was grouped under, and its weight's shards as the module holds them."""
    from torch.distributed._shard.sharded_tensor import ShardedTensor
    from torchrec.distributed.embedding import ShardedEmbeddingCollection
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

    out = {}
    for path, module in model.named_modules():
        if not isinstance(module, (ShardedEmbeddingBagCollection, ShardedEmbeddingCollection)):
            continue
        path = path.removeprefix("_dmp_wrapped_module.").removeprefix("module.")
        weights = {k.split(".")[-2]: v for k, v in module.state_dict().items() if k.endswith(".weight")}
        shardings = (module._sharding_type_to_sharding.items() if isinstance(module, ShardedEmbeddingCollection)
                     else zip(module._sharding_types, module._embedding_shardings, strict=True))
        for sharding_type, sharding in shardings:
            for config in sharding.embedding_tables():
                weight = weights[config.name]
                if isinstance(weight, ShardedTensor):
                    shards = sorted((s.placement.rank() if s.placement else None, s.shard_offsets, s.shard_sizes)
                                    for s in weight.metadata().shards_metadata)
                else:  # data_parallel: a full replica
                    shards = [(None, [0, 0], list(weight.shape))]
                out[(path, config.name)] = (sharding_type, shards)
    return out


def planned(plan) -> dict:
    """What the plan says, in ``applied``'s terms: {(module, table): (sharding type, shards)}."""
    expected = {}
    for t in plan.tables:
        shards = ([(None, [0, 0], list(t.shards[0].sizes))] if t.replicated
                  else sorted((s.rank, list(s.offsets), list(s.sizes)) for s in t.shards))
        expected[(t.module, t.name)] = (t.sharding_type.value, shards)
    return expected


def test_dmp_shards_every_module_of_the_model_exactly_as_planned(single_process_group, plan):
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    assert plan.format == "shardflow.plan/v3" and plan_modules(plan) == {
        USER: ModuleKind.EMBEDDING_BAG_COLLECTION, SEQUENCE: ModuleKind.EMBEDDING_COLLECTION}
    model = TwoTowerModel(spec_from_rows(ROWS))
    dmp = DistributedModelParallel(model, device=torch.device("cpu"), plan=to_sharding_plan(plan),
                                   sharders=sharders_for(plan))

    expected = planned(plan)
    assert applied(dmp) == expected
    assert {st for st, _ in expected.values()} == {"table_wise", "column_wise", "data_parallel", "row_wise"}
    assert len(plan.table(f"{USER}.geo").shards) == 2  # 256 columns in blocks of 128

    users = KeyedJaggedTensor.from_lengths_sync(keys=["id", "geo", "age"], values=torch.tensor([1, 2, 3, 4, 5, 6]),
                                                lengths=torch.tensor([1, 1, 1, 1, 1, 1]))
    pooled = dmp.module.towers.user.ebc(users).to_dict()
    assert pooled["geo"].shape == (2, 256) and pooled["age"].shape == (2, 8)
    sequence = KeyedJaggedTensor.from_lengths_sync(keys=["item", "history", "query"],
                                                   values=torch.arange(9), lengths=torch.tensor([2, 1, 3, 0, 2, 1]))
    per_id = dmp.module.sequence.blocks[0].ec(sequence)
    assert per_id["item"].values().shape == (3, 32) and per_id["history"].values().shape == (3, 32)


def test_one_module_plans_keep_their_sharding_plan_at_the_path_the_caller_names():
    rows = [dict(name="a", num_embeddings=100, embedding_dim=16), dict(name="b", num_embeddings=10, embedding_dim=8)]
    topology = topology_from_dict(dict(world_size=2, compute_device="cpu", ddr_cap="4GiB"))
    plan = plan_spec(spec_from_rows(rows), topology)
    assert plan.format == "shardflow.plan/v2"
    assert list(to_sharding_plan(plan).plan) == [DEFAULT_MODULE]  # shardflow's own model's EBC
    assert list(to_sharding_plan(plan, "").plan) == [""]
    assert set(module_sharding_plan(plan)) == {"a", "b"}
    assert [type(s).__name__ for s in sharders_for(plan)] == ["EmbeddingBagCollectionSharder"]


def test_module_sharding_plan_of_a_many_module_plan_names_its_module(plan):
    with pytest.raises(ValueError, match="2 modules"):
        module_sharding_plan(plan)
    assert set(module_sharding_plan(plan, SEQUENCE)) == {"id", "history", "query"}
    assert [type(s).__name__ for s in sharders_for(plan)] == ["EmbeddingBagCollectionSharder",
                                                              "EmbeddingCollectionSharder"]
    assert {p: dict(m) for p, m in to_sharding_plan(plan).plan.items()}[USER]["id"].sharding_type == \
        ShardingType.TABLE_WISE.value


def test_the_default_module_is_where_shardflows_own_training_model_holds_its_tables():
    from rec.train.model import EBC_PATH

    assert EBC_PATH == DEFAULT_MODULE  # a spec without modules means shardflow's own model
