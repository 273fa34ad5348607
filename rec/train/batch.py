"""A training batch for a model of several embedding modules: one KeyedJaggedTensor per module.

TorchRec's ``Batch`` carries one KJT, which serves one module (shardflow's DLRM). ``ModuleBatch``
carries a KJT per module path, so that each module gets exactly its own features (two modules may
use the same feature name) and ``TrainPipelineSparseDist`` finds each module's input as
``batch.sparse_features[path]`` when it traces the model.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor
from torchrec.streamable import Pipelineable


@dataclass
class ModuleBatch(Pipelineable):  # type: ignore[misc]  # torchrec is untyped
    dense_features: torch.Tensor
    sparse_features: dict[str, KeyedJaggedTensor]  # module path -> that module's features
    labels: torch.Tensor

    def to(self, device: torch.device, non_blocking: bool = False) -> ModuleBatch:
        return ModuleBatch(
            dense_features=self.dense_features.to(device=device, non_blocking=non_blocking),
            sparse_features={path: kjt.to(device=device, non_blocking=non_blocking)
                             for path, kjt in self.sparse_features.items()},
            labels=self.labels.to(device=device, non_blocking=non_blocking),
        )

    def record_stream(self, stream: torch.Stream) -> None:
        self.dense_features.record_stream(stream)
        for kjt in self.sparse_features.values():
            kjt.record_stream(stream)
        self.labels.record_stream(stream)

    def pin_memory(self) -> ModuleBatch:
        return ModuleBatch(
            dense_features=self.dense_features.pin_memory(),
            sparse_features={path: kjt.pin_memory() for path, kjt in self.sparse_features.items()},
            labels=self.labels.pin_memory(),
        )
