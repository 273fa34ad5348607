"""Model factories for ``shardflow spec from-model`` (targets ``model_factories:NAME``): the kind of
function a user writes, returning a TorchRec model (and constraints)."""

from __future__ import annotations

import torch
from torch import nn
from torchrec.distributed.planner.types import ParameterConstraints
from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType
from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection
from torchrec.modules.feature_processor_ import PositionWeightedModuleCollection
from torchrec.modules.fp_embedding_modules import FeatureProcessedEmbeddingBagCollection

META = torch.device("meta")


def _ebc(*tables: tuple[str, int, int], pooling: PoolingType = PoolingType.SUM, weighted: bool = False):
    return EmbeddingBagCollection([EmbeddingBagConfig(name=n, num_embeddings=r, embedding_dim=d, feature_names=[n],
                                                      pooling=pooling) for n, r, d in tables],
                                  is_weighted=weighted, device=META)


def _ec(dim: int, *tables: tuple[str, int]):
    return EmbeddingCollection([EmbeddingConfig(name=n, num_embeddings=r, embedding_dim=dim, feature_names=[n])
                                for n, r in tables], device=META)


class Tower(nn.Module):
    def __init__(self, ebc: nn.Module, width: int) -> None:
        super().__init__()
        self.ebc = ebc
        self.mlp = nn.Linear(width, 8)


class RecModel(nn.Module):
    """Two bag towers in a ModuleList, a sequence tower of two ECs, a feature-processed EBC, dense layers."""

    def __init__(self) -> None:
        super().__init__()
        self.towers = nn.ModuleList([
            Tower(_ebc(("user_id", 50_000, 64), ("user_geo", 1_000, 64)), 128),
            Tower(_ebc(("item_id", 80_000, 64), ("item_cat", 500, 32), pooling=PoolingType.MEAN), 96),
        ])
        self.sequence = nn.Module()
        self.sequence.history = _ec(32, ("item_id", 80_000), ("query", 20_000))
        self.sequence.context = nn.Sequential(_ec(16, ("page", 300)))
        self.positions = FeatureProcessedEmbeddingBagCollection(
            _ebc(("clicks", 1_000, 16), weighted=True), PositionWeightedModuleCollection({"clicks": 10}, META))
        self.over = nn.Linear(8, 1)


def rec_model():
    constraints = {
        "user_id": ParameterConstraints(sharding_types=["row_wise", "table_wise"], pooling_factors=[3.0]),
        "item_id": ParameterConstraints(pooling_factors=[20.0]),  # both tables named item_id: TorchRec keys by name
        "query": ParameterConstraints(sharding_types=["column_wise"], pooling_factors=[5.0], enforce_hbm=True),
        "nowhere": ParameterConstraints(pooling_factors=[1.0]),
    }
    return RecModel(), constraints


def model_only():
    return RecModel()


def with_batches():
    """What ``train --model`` takes: the model and its batches (never called by ``spec from-model``)."""
    def batches(rank, world_size, batch_size, device):
        raise AssertionError("spec from-model called the batches")

    return RecModel(), batches


def no_model():
    return None


def fails():
    raise RuntimeError("the checkpoint path is not set\nsecond line")


def nothing_to_plan():
    return nn.Sequential(nn.Linear(4, 4))


def sparse_nn():
    """TorchRec's own test model: an EmbeddingBagCollection of id lists beside a weighted one of
    id-score lists."""
    from torchrec.distributed.test_utils.test_model import TestSparseNN

    tables = [EmbeddingBagConfig(name=f"t{i}", num_embeddings=1_000, embedding_dim=16, feature_names=[f"f{i}"])
              for i in range(3)]
    weighted = [EmbeddingBagConfig(name=f"w{i}", num_embeddings=500, embedding_dim=16, feature_names=[f"wf{i}"])
                for i in range(2)]
    return TestSparseNN(tables=tables, weighted_tables=weighted, dense_device=META, sparse_device=META)
