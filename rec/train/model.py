"""The model built from the spec: an EmbeddingBagCollection on the meta device under a
DLRM-style model, wrapped for training (``DLRMTrain``: BCE loss, pipeline-compatible forward).

The EBC always sits at ``EBC_PATH`` so the plan's ShardingPlan addresses it the same way.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.models.dlrm import DLRM, DLRM_DCN, DenseArch, DLRMTrain, OverArch, SparseArch
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rec.errors import InputError, Problem
from rec.spec.types import Spec
from rec.train.config import ModelKind, TrainConfig
from rec.train.tables import embedding_bag_configs

EBC_PATH = "model.sparse_arch.embedding_bag_collection"


def resolve_model_kind(spec: Spec, kind: ModelKind) -> ModelKind:
    same_dim = len({t.embedding_dim for t in spec.tables}) == 1
    if kind is ModelKind.AUTO:
        return ModelKind.DLRM if same_dim else ModelKind.CONCAT
    if kind in (ModelKind.DLRM, ModelKind.DLRM_DCN) and not same_dim:
        dims = sorted({t.embedding_dim for t in spec.tables})
        raise InputError("Cannot build the model:", [Problem(
            f"--model {kind.value}", f"needs one embedding_dim for every table, the plan's tables have "
                                     f"{', '.join(map(str, dims))}; use --model concat or auto")])
    return kind


def build_model(spec: Spec, config: TrainConfig, dense_device: torch.device) -> DLRMTrain:
    """``DLRMTrain`` around the chosen model; embeddings on meta (DMP materialises its shards)."""
    ebc = EmbeddingBagCollection(tables=embedding_bag_configs(spec), device=torch.device("meta"))
    kind = resolve_model_kind(spec, config.model)
    dense = list(config.dense_arch_layer_sizes)
    over = list(config.over_arch_layer_sizes)
    if kind is ModelKind.CONCAT:
        module: nn.Module = ConcatDLRM(ebc, config.dense_in_features, dense, over, dense_device)
    else:
        dim = spec.tables[0].embedding_dim
        dense = [*dense[:-1], dim]  # DLRM projects dense features to the embedding dim
        if kind is ModelKind.DLRM:
            module = DLRM(ebc, config.dense_in_features, dense, over, dense_device)
        else:
            module = DLRM_DCN(ebc, config.dense_in_features, dense, over, dcn_num_layers=2,
                              dcn_low_rank_dim=min(dim, 16), dense_device=dense_device)
    return DLRMTrain(module)


class ConcatDLRM(nn.Module):
    """DLRM's sparse and dense arches with concatenation as the interaction, so that tables of
    different dims (TorchRec's DLRM needs one dim) train under the same wrapper."""

    def __init__(self, ebc: EmbeddingBagCollection, dense_in_features: int,
                 dense_sizes: list[int], over_sizes: list[int], dense_device: torch.device):
        super().__init__()
        self.sparse_arch = SparseArch(ebc)
        self.dense_arch = DenseArch(dense_in_features, dense_sizes, dense_device)
        pooled = sum(c.embedding_dim * len(c.feature_names) for c in ebc.embedding_bag_configs())
        self.over_arch = OverArch(dense_sizes[-1] + pooled, over_sizes, dense_device)

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        embedded = self.sparse_arch.embedding_bag_collection(sparse_features).values()
        logits: torch.Tensor = self.over_arch(torch.cat([self.dense_arch(dense_features), embedded], dim=1))
        return logits
