"""A spec's embedding modules as TorchRec builds them: an ``EmbeddingBagCollection`` per pooled module,
an ``EmbeddingCollection`` per unpooled one (pooling NONE), each placed at its path in a model.

Planning (``spec_model``) gives TorchRec each table's ``data_type`` as the spec says; the jobs that
shard and train the modules (``trained=True``) give it the type shardflow sized the table for
(``trained_data_type``). Imports torch/torchrec (inside the functions); the planning path never
loads this module.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from rec.sharding import DataType, ModuleKind, Pooling
from rec.spec.types import Spec, TableSpec

if TYPE_CHECKING:
    import torch
    from torch import nn


def trained_data_type(data_type: DataType) -> DataType:
    """The type a table of ``data_type`` is sharded and trained as: FP32 as FP32, any other as FP16.

    What the planner sized: TorchRec's estimators take a table's bytes per weight from the unsharded
    module's weight, which ``EmbeddingBagCollection``/``EmbeddingCollection`` allocate as float32 for
    FP32 and float16 for every other type (``DataType.bytes_per_element``). The sharded kernel, though,
    takes ``data_type`` itself as its ``weights_precision``, and FBGEMM's training TBE cannot train the
    others: INT8/INT4/INT2 rows carry their scale and bias (more bytes than planned, and TorchRec's
    shard metadata refuses them), and its cpu kernels have no BFloat16. BF16 becomes FP16 on cuda too
    (the same 2 bytes; FBGEMM documents FP32 and FP16 as the training weights' types): one type on every
    device keeps checkpoints and the unsharded model of export and prediction (float16) alike."""
    return DataType.FP32 if data_type is DataType.FP32 else DataType.FP16


def embedding_configs(tables: Sequence[TableSpec], trained: bool = False) -> list[Any]:
    """Each table as TorchRec's config: ``EmbeddingBagConfig`` (pooled), ``EmbeddingConfig`` (NONE);
    ``trained``: of the type it trains as (``trained_data_type``), else of the spec's ``data_type``."""
    from torchrec.modules.embedding_configs import DataType as TorchRecDataType
    from torchrec.modules.embedding_configs import EmbeddingBagConfig, EmbeddingConfig, PoolingType

    configs: list[Any] = []
    for t in tables:
        data_type = trained_data_type(t.data_type) if trained else t.data_type
        common = dict(name=t.name, num_embeddings=t.num_embeddings, embedding_dim=t.embedding_dim,
                      feature_names=list(t.feature_names), data_type=TorchRecDataType[data_type.value])
        if t.pooling is Pooling.NONE:
            configs.append(EmbeddingConfig(**common))
        else:
            configs.append(EmbeddingBagConfig(**common, pooling=PoolingType[t.pooling.value]))
    return configs


def embedding_module(kind: ModuleKind, tables: Sequence[TableSpec], device: torch.device | str = "meta",
                     trained: bool = False) -> nn.Module:
    """The TorchRec module of ``kind`` holding ``tables`` (meta device: nothing is allocated), weighted
    where its tables are (``is_weighted``); ``trained``: its tables of the types they train as
    (``embedding_configs``)."""
    import torch
    from torchrec.modules.embedding_modules import EmbeddingBagCollection, EmbeddingCollection

    configs = embedding_configs(tables, trained)
    module: nn.Module
    if kind is ModuleKind.EMBEDDING_COLLECTION:
        module = EmbeddingCollection(tables=configs, device=torch.device(device))
    else:
        module = EmbeddingBagCollection(tables=configs, is_weighted=any(t.is_weighted for t in tables),
                                        device=torch.device(device))
    return module


def embedding_modules(spec: Spec, device: torch.device | str = "meta", trained: bool = False) -> dict[str, nn.Module]:
    """Every module of ``spec`` by path, in model order (``Spec.modules``), its tables in spec order;
    ``trained``: as the training and measuring jobs shard them (``embedding_configs``)."""
    return {path: embedding_module(kind, [t for t in spec.tables if t.module == path], device, trained)
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
