"""A spec's embedding modules as TorchRec builds them: an ``EmbeddingBagCollection`` per pooled module,
an ``EmbeddingCollection`` per unpooled one (pooling NONE), each placed at its path in a model.

Imports torch/torchrec (inside the functions); the planning path never loads this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rec.sharding import ModuleKind, Pooling
from rec.spec.types import Spec, TableSpec

if TYPE_CHECKING:
    import torch
    from torch import nn


def embedding_configs(tables: Sequence[TableSpec]) -> list[Any]:
    """Each table as TorchRec's config: ``EmbeddingBagConfig`` (pooled), ``EmbeddingConfig`` (NONE)."""
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType

    configs: list[Any] = []
    for t in tables:
        common = dict(name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
                      feature_names=list(t.feature_names), data_type=DataType[t.data_type.value])
        if t.pooling is Pooling.NONE:
            configs.append(EmbeddingConfig(**common))
        else:
            configs.append(EmbeddingBagConfig(**common, pooling=PoolingType[t.pooling.value]))
    return configs


def embedding_module(kind: ModuleKind, tables: Sequence[TableSpec], device: torch.device | str = "meta") -> nn.Module:
    """The TorchRec module of ``kind`` holding ``tables`` (meta device: nothing is allocated)."""
    import torch
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    configs = embedding_configs(tables)
    module: nn.Module
    if kind is ModuleKind.EMBEDDING_COLLECTION:
        module = EmbeddingCollection(tables=configs, device=torch.device(device))
    else:
        module = EmbeddingBagCollection(tables=configs, device=torch.device(device))
    return module


def embedding_modules(spec: Spec, device: torch.device | str = "meta") -> dict[str, nn.Module]:
    """Every module of ``spec`` by path, in model order (``Spec.modules``), its tables in spec order."""
    return {path: embedding_module(kind, [t for t in spec.tables if t.module == path], device)
            for path, kind in spec.modules.items()}


def place(root: nn.Module, modules: Mapping[str, nn.Module]) -> nn.Module:
    """``root`` with each of ``modules`` at its dotted path; missing parents become empty
    ``nn.Module`` containers, created in the order the paths come. Returns ``root``."""
    from torch import nn

    for path, module in modules.items():
        *parents, leaf = path.split(".")
        parent = root
        for part in parents:
            child = parent._modules.get(part)
            if child is None:
                child = nn.Module()
                parent.add_module(part, child)
            parent = child
        parent.add_module(leaf, module)
    return root


def spec_model(spec: Spec, device: torch.device | str = "meta") -> nn.Module:
    """A module tree holding exactly the spec's embedding modules at their paths (no dense layers):
    what shardflow's cost model stands for, and a skeleton to plan or shard."""
    from torch import nn

    return place(nn.Module(), embedding_modules(spec, device))
