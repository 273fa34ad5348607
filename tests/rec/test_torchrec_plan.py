"""A shardflow plan converts into a ShardingPlan that DistributedModelParallel applies as is."""

from __future__ import annotations

import pytest

from rec.plan.torchrec_plan import to_sharding_plan
from rec.planning import plan_spec
from rec.sharding import ShardingType
from rec.spec import spec_from_rows
from rec.topology import topology_from_dict

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")


def test_dmp_applies_the_plan_without_planning(single_process_group):
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    from rec.train.tables import embedding_bag_configs

    spec = spec_from_rows([
        dict(name="small", num_embeddings=100, embedding_dim=16),
        dict(name="wide", num_embeddings=1000, embedding_dim=256, sharding_types=["column_wise"]),
        dict(name="replicated", num_embeddings=50, embedding_dim=8, sharding_types=["data_parallel"]),
    ])
    topology = topology_from_dict(dict(world_size=1, compute_device="cpu", ddr_cap="4GiB"))
    plan = plan_spec(spec, topology)
    ebc = EmbeddingBagCollection(tables=embedding_bag_configs(spec), device=torch.device("meta"))
    sharding_plan = to_sharding_plan(plan, "")  # the model is the EBC itself
    dmp = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=sharding_plan,
                                   sharders=[EmbeddingBagCollectionSharder()])
    applied = dmp.plan.plan[""]
    for t in plan.tables:
        assert applied[t.name].sharding_type == t.sharding_type.value
        assert applied[t.name].compute_kernel == t.compute_kernel.value
    assert plan.table("wide").sharding_type is ShardingType.COLUMN_WISE
    assert len(plan.table("wide").shards) == 2  # 256 columns in blocks of 128

    kjt = KeyedJaggedTensor.from_lengths_sync(
        keys=["small", "wide", "replicated"], values=torch.tensor([1, 2, 3, 4, 5, 6]),
        lengths=torch.tensor([1, 1, 1, 1, 1, 1]))
    pooled = dmp(kjt).to_dict()
    assert pooled["wide"].shape == (2, 256)
    assert pooled["small"].shape == (2, 16)
