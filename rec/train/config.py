"""The training job's settings: one frozen dataclass, every knob with its default and bounds.

The ``shardflow train``/``run`` flags, the Prefect flows' ``training`` parameter and the job's own
command line (``python -m rec.train.job``) are all derived from ``TrainConfig`` (``rec.settings``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from rec.data.ids import IdsPolicy
from rec.errors import InputError, Problem
from rec.settings import knob
from rec.spec.types import Spec

# Fault injection for tests: "ITER:RANK" (the rank exits) or "ITER:RANK:raise" (it raises).
FAIL_AT_ENV = "SHARDFLOW_FAIL_AT_ITERATION"
# The launcher's --node-rank, for the ranks' messages: torchrun's c10d rendezvous numbers the nodes
# as they arrive (GROUP_RANK), which need not be the --node-rank the user gave each.
NODE_RANK_ENV = "SHARDFLOW_NODE_RANK"
# The training job's flag: the plan_id the launcher checked (a plan rewritten since is refused).
PLAN_ID_FLAG = "--plan-id"
MAX_ITERATIONS = 10**9
MAX_BATCH_SIZE = 1 << 20  # per rank; far beyond what fits a GPU, well inside int32 offsets
COLLECTIVE_TIMEOUT_S = 600  # NCCL's default, for gloo too (its own is 30 minutes): rec.train.collectives


class ModelKind(StrEnum):
    """shardflow's own models (``--model``); a value with ':' is a model factory TARGET instead."""

    AUTO = "auto"  # dlrm when every table has the same dim, concat otherwise
    DLRM = "dlrm"  # TorchRec's DLRM interaction (all dims equal)
    DLRM_DCN = "dlrm_dcn"  # TorchRec's DLRM_DCN interaction (all dims equal)
    CONCAT = "concat"  # dense arch + concatenated pooled embeddings + over arch (any dims)


TARGET_SEPARATOR = ":"  # package.module:function, path/to/file.py:function


class PipelineKind(StrEnum):
    AUTO = "auto"  # sparse_dist on several GPUs, naive otherwise (docs/gpu.md: what was measured)
    SPARSE_DIST = "sparse_dist"  # TrainPipelineSparseDist: input dist overlapped with compute
    NAIVE = "naive"  # plain loop: forward, backward, step

    def on(self, world_size: int, device: str) -> PipelineKind:
        """The pipeline this kind runs on ``world_size`` ranks of ``device``. The naive loop measured
        faster where the next batch's input distribution has nothing to overlap with: one GPU (its
        all-to-all a local copy) and gloo on cpu (bench/RESULTS.md §3). Across GPUs the all-to-all
        crosses NVLink or the network, which TorchRec's pipeline overlaps with the current batch's
        compute."""
        if self is not PipelineKind.AUTO:
            return self
        return PipelineKind.SPARSE_DIST if device == "cuda" and world_size > 1 else PipelineKind.NAIVE


@dataclass(frozen=True)
class TrainConfig:
    iterations: int = field(default=100, metadata=knob(
        "training iterations", minimum=1, maximum=MAX_ITERATIONS))
    warmup: int = field(default=10, metadata=knob(
        "first iterations left out of the latency statistics", minimum=0, maximum=MAX_ITERATIONS))
    batch_size: int | None = field(default=None, metadata=knob(
        "samples per rank and iteration; none: the plan topology's batch_size",
        minimum=1, maximum=MAX_BATCH_SIZE))
    model: str = field(default=ModelKind.AUTO.value, metadata=knob(
        f"shardflow's model: {', '.join(ModelKind)} (auto: dlrm when all tables share one dim, concat "
        "otherwise); or your own, TARGET: package.module:function or path/to/file.py:function returning "
        "(model, batches), sharded with the plan (docs/training.md)", metavar="KIND|TARGET"))
    pipeline: PipelineKind = field(default=PipelineKind.AUTO, metadata=knob(
        "sparse_dist: TorchRec's TrainPipelineSparseDist (the next batch's input distribution overlaps this "
        "one's compute); naive: plain loop; auto: sparse_dist on several GPUs, naive on one GPU and on cpu "
        "(docs/gpu.md)"))
    data: str | None = field(default=None, metadata=knob(
        "Parquet training data: a file, a directory, a glob or a URI (docs/training.md); none: synthetic "
        "batches", metavar="PATH", path=True))
    ids: IdsPolicy = field(default=IdsPolicy.ERROR, metadata=knob(
        "an id outside its table's rows [0, num_embeddings): error (the job stops, naming the feature), "
        "modulo (id mod rows) or hash (a fixed 64-bit hash of the id, mod rows)"))
    shuffle: bool = field(default=True, metadata=knob(
        "shuffle every epoch (seeded by --seed and the epoch): the row groups' order, and rows within "
        "windows of --shuffle-window rows"))
    shuffle_window: int = field(default=1 << 16, metadata=knob(
        "rows a rank shuffles together (and reads at once: its memory for data)", minimum=1, maximum=1 << 26))
    prefetch_batches: int = field(default=4, metadata=knob(
        "batches a background thread prepares ahead of the training loop", minimum=1, maximum=1024))
    read_threads: int | None = field(default=None, metadata=knob(
        "threads each rank reads and converts its data with, a window each; none: the cores of this "
        "machine per rank on it, at most 4", minimum=1, maximum=64))
    eval_data: str | None = field(default=None, metadata=knob(
        "Parquet data to evaluate on (AUC, logloss, normalized entropy over every rank's samples) every "
        "--eval-every iterations and at the end; none: no evaluation", metavar="PATH", path=True))
    eval_every: int = field(default=0, metadata=knob(
        "evaluate every N iterations (and at the end); 0: at the end only", minimum=0))
    eval_batches: int = field(default=0, metadata=knob(
        "batches per rank an evaluation reads; 0: all of --eval-data", minimum=0))
    seed: int = field(default=0, metadata=knob(
        "random seed of the model, the data's order (shuffling) and synthetic data", minimum=0, maximum=2**63 - 1))
    dense_in_features: int = field(default=13, metadata=knob(
        "dense features per sample", minimum=1, maximum=1 << 16))
    dense_arch_layer_sizes: tuple[int, ...] = field(default=(64, 32), metadata=knob(
        "dense arch layer sizes (dlrm, dlrm_dcn: the last becomes the tables' embedding dim, to which DLRM "
        "projects the dense features)"))
    over_arch_layer_sizes: tuple[int, ...] = field(default=(64, 1), metadata=knob(
        "over arch layer sizes (the last is 1: one logit)"))
    dense_lr: float = field(default=0.01, metadata=knob(
        "Adagrad learning rate of the dense part", minimum=0.0))
    embedding_lr: float = field(default=0.05, metadata=knob(
        "fused row-wise Adagrad learning rate of the sharded tables", minimum=0.0))
    synthetic_batches: int = field(default=16, metadata=knob(
        "distinct synthetic batches, cycled", minimum=1, maximum=1 << 16))
    checkpoint_every: int = field(default=0, metadata=knob(
        "write a sharded checkpoint every N iterations and after the last; 0: never", minimum=0))
    checkpoint_dir: str | None = field(default=None, metadata=knob(
        "where checkpoints go; none: OUT/checkpoints", metavar="DIR", path=True))
    keep_checkpoints: int = field(default=3, metadata=knob(
        "checkpoints kept; older ones are deleted", minimum=1))
    resume: bool = field(default=False, metadata=knob(
        "resume from the newest checkpoint in the checkpoint directory"))
    resume_from: str | None = field(default=None, metadata=knob(
        "start from the newest checkpoint of a training with another plan (its output directory): "
        "tables are matched by name, a resized table keeps its old rows, added ones are initialized; "
        "none: start fresh", metavar="DIR", path=True))
    collective_timeout: int = field(default=COLLECTIVE_TIMEOUT_S, metadata=knob(
        "seconds a rank waits in a collective for the others (a peer frozen, or lost) before the training "
        "fails (NCCL's default, gloo's too)", minimum=10, maximum=7 * 24 * 3600, metavar="SECONDS"))

    @property
    def model_target(self) -> str | None:
        """The user's model factory ``--model`` names, or None for one of shardflow's models."""
        return self.model if TARGET_SEPARATOR in self.model else None

    @property
    def model_kind(self) -> ModelKind:
        """shardflow's model ``--model`` names (``model_target`` None)."""
        return ModelKind(self.model)

    def problems(self) -> list[Problem]:
        """What the bounds alone do not catch."""
        out = []
        if self.model_target is None and self.model not in set(ModelKind):
            out.append(Problem("--model", f"{self.model!r} is neither one of shardflow's models "
                                          f"({', '.join(ModelKind)}) nor a TARGET (package.module:function "
                                          "or path/to/file.py:function)"))
        if self.model_target is not None and self.data:
            out.append(Problem("--data", f"feeds shardflow's own model; the model factory {self.model_target} "
                                         "gives its own batches"))
        if self.model_target is not None and self.eval_data:
            out.append(Problem("--eval-data", f"evaluates shardflow's own model; the model factory "
                                              f"{self.model_target} has its own outputs"))
        if self.eval_every and not self.eval_data:
            out.append(Problem("--eval-every", "needs --eval-data, the data to evaluate on"))
        if self.warmup >= self.iterations:
            out.append(Problem("--warmup", f"{self.warmup} leaves no measured iteration of "
                                           f"{self.iterations}; use fewer warm-up iterations or more iterations"))
        if self.over_arch_layer_sizes[-1:] != (1,):
            out.append(Problem("--over-arch-layer-sizes", "must end with 1 (the model predicts one logit)"))
        if self.resume and self.resume_from:
            out.append(Problem("--resume-from", "give --resume (this plan's own checkpoints) or "
                                                "--resume-from (another plan's), not both"))
        if any(s < 1 for s in self.dense_arch_layer_sizes + self.over_arch_layer_sizes):
            out.append(Problem("--dense-arch-layer-sizes/--over-arch-layer-sizes", "sizes must be >= 1"))
        return out


def resolve_model_kind(spec: Spec, kind: ModelKind) -> ModelKind:
    """``kind`` for ``spec``'s tables: auto resolved (dlrm for one dim, concat otherwise); InputError for
    an interaction that needs one dim on tables of several."""
    same_dim = len({t.embedding_dim for t in spec.tables}) == 1
    if kind is ModelKind.AUTO:
        return ModelKind.DLRM if same_dim else ModelKind.CONCAT
    if kind in (ModelKind.DLRM, ModelKind.DLRM_DCN) and not same_dim:
        dims = sorted({t.embedding_dim for t in spec.tables})
        raise InputError("Cannot build the model:", [Problem(
            f"--model {kind.value}", f"needs one embedding_dim for every table, the plan's tables have "
                                     f"{', '.join(map(str, dims))}; use --model concat or auto")])
    return kind
