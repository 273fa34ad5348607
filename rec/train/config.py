"""Training configuration: one dataclass, every knob with a default."""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class ModelKind(str, Enum):
    AUTO = "auto"  # dlrm when every table has the same dim, concat otherwise
    DLRM = "dlrm"  # torchrec.models.dlrm.DLRM (all dims equal)
    DLRM_DCN = "dlrm_dcn"  # torchrec.models.dlrm.DLRM_DCN (all dims equal)
    CONCAT = "concat"  # dense arch + concatenated pooled embeddings + over arch (any dims)


class PipelineKind(str, Enum):
    SPARSE_DIST = "sparse_dist"  # TrainPipelineSparseDist: input dist overlapped with compute
    NAIVE = "naive"  # plain loop: forward, backward, step


@dataclass(frozen=True)
class TrainConfig:
    iterations: int = 100
    warmup: int = 10  # iterations left out of the latency statistics
    batch_size: int | None = None  # per rank; None: the plan topology's batch_size
    dense_in_features: int = 13
    dense_arch_layer_sizes: tuple[int, ...] = (64, 32)
    over_arch_layer_sizes: tuple[int, ...] = (64, 1)
    model: ModelKind = ModelKind.AUTO
    pipeline: PipelineKind = PipelineKind.SPARSE_DIST
    dense_lr: float = 0.01
    embedding_lr: float = 0.05  # fused row-wise Adagrad on the sharded tables
    seed: int = 0
    data: str | None = None  # Parquet file or directory; None: synthetic batches
    synthetic_batches: int = 16  # distinct synthetic batches, cycled
    checkpoint_every: int = 0  # 0: never
    checkpoint_dir: str | None = None
    resume: bool = False
