"""The spec's tables as the training model holds them (torch-free until a config is built)."""

from __future__ import annotations

from typing import Any

from rec.sharding import ModuleKind
from rec.spec.types import DEFAULT_MODULE, Spec


def one_default_ebc(spec: Spec) -> bool:
    """Every table in one EmbeddingBagCollection at ``DEFAULT_MODULE``: the spec of shardflow's
    original model (TorchRec's DLRM, fed TorchRec's ``Batch``), as every spec without ``module`` is."""
    return spec.modules == {DEFAULT_MODULE: ModuleKind.EMBEDDING_BAG_COLLECTION}


def embedding_bag_configs(spec: Spec) -> list[Any]:
    """The tables of a pooled spec as TorchRec ``EmbeddingBagConfig``s, of the types they train as
    (tables of pooling NONE: ``rec.spec.torchrec_modules.embedding_configs``, which gives each table
    its own config)."""
    from rec.spec.torchrec_modules import embedding_configs

    if any(t.pooling.module_kind is ModuleKind.EMBEDDING_COLLECTION for t in spec.tables):
        raise ValueError("a spec with pooling NONE tables has EmbeddingConfigs: use embedding_configs")
    return embedding_configs(spec.tables, trained=True)
