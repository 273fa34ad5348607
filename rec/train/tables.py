"""The spec's tables as torchrec EmbeddingBagConfigs."""

from __future__ import annotations

from typing import Any

from rec.spec.types import Spec


def embedding_bag_configs(spec: Spec) -> list[Any]:
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, PoolingType

    return [
        EmbeddingBagConfig(
            name=t.name,
            num_embeddings=t.num_embeddings,
            embedding_dim=t.embedding_dim,
            feature_names=list(t.feature_names),
            pooling=PoolingType[t.pooling.value],
            data_type=DataType[t.data_type.value],
        )
        for t in spec.tables
    ]
