"""The model built from the spec, with its embedding modules on the meta device (DMP materialises
their shards), wrapped for training: ``forward(batch)`` returns ``(loss, (loss, logits, labels))``
with a BCE loss, as TorchRec's ``DLRMTrain``, which the sparse-dist pipeline accepts.

A spec of one EmbeddingBagCollection at ``EBC_PATH`` (every spec without ``module``) gets TorchRec's
``DLRMTrain`` around its DLRM (or DLRM_DCN, or ``ConcatDLRM`` for tables of several dims), as
always (a weighted EmbeddingBagCollection where its tables are ``is_weighted``). Any other spec —
several modules, any nesting, EmbeddingCollections — gets ``ModulesDLRM``: each module at its path
(weighted where its tables are), and each EmbeddingCollection feature's per-id outputs averaged over
the sequence, so that every feature gives one vector per sample to the same interactions.
"""

from __future__ import annotations

import torch
from torch import nn
from torchrec.datasets.utils import Batch
from torchrec.models.dlrm import (
    DLRM,
    DLRM_DCN,
    DenseArch,
    DLRMTrain,
    InteractionArch,
    InteractionDCNArch,
    OverArch,
    SparseArch,
    choose,
)
from torchrec.modules.crossnet import LowRankCrossNet
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.sparse.jagged_tensor import JaggedTensor, KeyedJaggedTensor

from rec.sharding import ModuleKind
from rec.spec.torchrec_modules import embedding_module, embedding_modules, place
from rec.spec.types import DEFAULT_MODULE, Spec
from rec.train.batch import ModuleBatch
from rec.train.config import ModelKind, TrainConfig, resolve_model_kind
from rec.train.tables import one_default_ebc

EBC_PATH = DEFAULT_MODULE  # where DLRMTrain(DLRM(ebc)) holds its EmbeddingBagCollection
DCN_LAYERS = 2


def build_model(spec: Spec, config: TrainConfig, dense_device: torch.device,
                embedding_device: torch.device | str = "meta") -> nn.Module:
    """The training model of ``spec``: embeddings on ``embedding_device`` (meta: DMP allocates their
    shards; a real device for an unsharded model, as export and prediction use), dense layers on
    ``dense_device``."""
    kind = resolve_model_kind(spec, config.model_kind)
    dense = list(config.dense_arch_layer_sizes)
    over = list(config.over_arch_layer_sizes)
    if not one_default_ebc(spec):
        return ModulesDLRM(spec, kind, config.dense_in_features, dense, over, dense_device, embedding_device)
    ebc = embedding_module(ModuleKind.EMBEDDING_BAG_COLLECTION, spec.tables, embedding_device, trained=True)
    assert isinstance(ebc, EmbeddingBagCollection)
    if kind is ModelKind.CONCAT:
        module: nn.Module = ConcatDLRM(ebc, config.dense_in_features, dense, over, dense_device)
    else:
        dim = spec.tables[0].embedding_dim
        dense = [*dense[:-1], dim]  # DLRM projects dense features to the embedding dim
        if kind is ModelKind.DLRM:
            module = DLRM(ebc, config.dense_in_features, dense, over, dense_device)
        else:
            module = DLRM_DCN(ebc, config.dense_in_features, dense, over, dcn_num_layers=DCN_LAYERS,
                              dcn_low_rank_dim=min(dim, 16), dense_device=dense_device)
    trained: nn.Module = DLRMTrain(module)
    return trained


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
        self._features = [f for c in ebc.embedding_bag_configs() for f in c.feature_names]

    def forward(self, dense_features: torch.Tensor, sparse_features: KeyedJaggedTensor) -> torch.Tensor:
        # By name: a sharded collection returns its features grouped by sharding, not in config order.
        pooled = self.sparse_arch.embedding_bag_collection(sparse_features).to_dict()
        embedded = [pooled[f] for f in self._features]
        logits: torch.Tensor = self.over_arch(torch.cat([self.dense_arch(dense_features), *embedded], dim=1))
        return logits


class ModulesDLRM(nn.Module):
    """The spec's embedding modules at their paths, beside a DLRM-style dense part (``DenseArches``,
    under one child whose name no module path starts with)."""

    def __init__(self, spec: Spec, kind: ModelKind, dense_in_features: int, dense_sizes: list[int],
                 over_sizes: list[int], dense_device: torch.device, embedding_device: torch.device | str = "meta"):
        super().__init__()
        place(self, embedding_modules(spec, embedding_device, trained=True))
        self._inputs = [(path, module_kind is ModuleKind.EMBEDDING_COLLECTION,
                         [f for t in spec.tables if t.module == path for f in t.feature_names])
                        for path, module_kind in spec.modules.items()]
        dims = [t.embedding_dim for t in spec.tables for _ in t.feature_names]
        self._arches = _free_name("dense", {path.split(".")[0] for path in spec.modules})
        self.add_module(self._arches, DenseArches(kind, dims, dense_in_features, dense_sizes, over_sizes,
                                                  dense_device))

    def forward(self, batch: ModuleBatch) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        logits = self.logits(batch)
        loss = nn.functional.binary_cross_entropy_with_logits(logits, batch.labels.float())
        return loss, (loss.detach(), logits.detach(), batch.labels.detach())

    def logits(self, batch: ModuleBatch) -> torch.Tensor:
        """One click logit per sample."""
        vectors: list[torch.Tensor] = []  # one (batch, dim) tensor per feature, in spec order
        for path, unpooled, features in self._inputs:
            out = self.get_submodule(path)(batch.sparse_features[path])
            if unpooled:  # EmbeddingCollection: {feature: JaggedTensor of per-id embeddings}
                vectors += [sequence_mean(out[f]) for f in features]
            else:  # EmbeddingBagCollection: a KeyedTensor of pooled embeddings
                pooled = out.to_dict()
                vectors += [pooled[f] for f in features]
        arches = self.get_submodule(self._arches)
        assert isinstance(arches, DenseArches)
        logits: torch.Tensor = arches(batch.dense_features, vectors).squeeze(-1)
        return logits


class DenseArches(nn.Module):
    """Dense arch, interaction and over arch of a DLRM over features of dims ``dims``: concatenation
    (any dims), or TorchRec's DLRM or DLRM_DCN interaction (one dim; the dense arch ends in it)."""

    def __init__(self, kind: ModelKind, dims: list[int], dense_in_features: int, dense_sizes: list[int],
                 over_sizes: list[int], dense_device: torch.device):
        super().__init__()
        features = len(dims)
        self.inter_arch: nn.Module | None = None
        if kind is ModelKind.CONCAT:
            self.dense_arch = DenseArch(dense_in_features, dense_sizes, dense_device)
            over_in = dense_sizes[-1] + sum(dims)
        else:
            dim = dims[0]
            self.dense_arch = DenseArch(dense_in_features, [*dense_sizes[:-1], dim], dense_device)
            if kind is ModelKind.DLRM:
                self.inter_arch = InteractionArch(features)
                over_in = dim + choose(features, 2) + features
            else:
                crossnet = LowRankCrossNet((features + 1) * dim, DCN_LAYERS, min(dim, 16))
                self.inter_arch = InteractionDCNArch(features, crossnet)
                over_in = (features + 1) * dim
        self.over_arch = OverArch(over_in, over_sizes, dense_device)

    def forward(self, dense_features: torch.Tensor, vectors: list[torch.Tensor]) -> torch.Tensor:
        dense = self.dense_arch(dense_features)
        if self.inter_arch is None:
            combined = torch.cat([dense, *vectors], dim=1)
        else:
            combined = self.inter_arch(dense, torch.stack(vectors, dim=1))
        logits: torch.Tensor = self.over_arch(combined)
        return logits


def logits(model: nn.Module, batch: Batch | ModuleBatch) -> torch.Tensor:
    """The click logits shardflow's model (``build_model``) gives ``batch``, without the loss."""
    if isinstance(model, DLRMTrain):
        out: torch.Tensor = model.model(batch.dense_features, batch.sparse_features).squeeze(-1)
        return out
    if isinstance(model, ModulesDLRM) and isinstance(batch, ModuleBatch):
        return model.logits(batch)
    raise TypeError(f"not shardflow's model and batch: {type(model).__name__}, {type(batch).__name__}")


def sequence_mean(sequence: JaggedTensor) -> torch.Tensor:
    """Each sample's per-id embeddings averaged over its sequence: (samples, dim); zeros for an
    empty sequence. Traceable by torch.fx, as the sparse-dist pipeline needs."""
    values, lengths = sequence.values(), sequence.lengths()
    sample = torch.repeat_interleave(lengths)
    summed = values.new_zeros((lengths.size(0), values.size(1))).index_add(0, sample, values)
    mean: torch.Tensor = summed / lengths.clamp(min=1).unsqueeze(1).to(values.dtype)
    return mean


def _free_name(base: str, taken: set[str]) -> str:
    name = base
    while name in taken:
        name += "_"
    return name
