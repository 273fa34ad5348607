"""Flow parameters <-> step settings.

Prefect shows and validates a flow's own signature, so the flows list their knobs as flat, typed
parameters whose defaults are the settings dataclasses' (``TrainConfig.iterations`` ...). The
parameter names are those of the settings fields, except the few below, kept from shardflow's
first flows (deployments and scripts pass them by name).

A flow builds its settings with ``search_settings`` and ``train_settings``, passing every parameter
by name: their arguments have no defaults, so a parameter left out fails at once instead of
silently taking a default.
"""

from __future__ import annotations

from dataclasses import fields
from typing import Any

from rec.cost.types import CostConfig
from rec.search import SearchConfig
from rec.train.config import PipelineKind, TrainConfig
from tasks.search import Backend, SearchSettings, with_profile
from tasks.train import TrainSettings

# settings field -> flow parameter, where the two names differ
PARAMETER_NAMES = {"iterations": "train_iterations", "pipeline": "train_pipeline"}


def parameter(name: str) -> str:
    return PARAMETER_NAMES.get(name, name)


def search_settings(*, backend: Backend, groups: int | None, max_regress: float, cost: CostConfig | None,
                    search: SearchConfig | None, profile_path: str | None) -> SearchSettings:
    """The SearchSettings of a flow's search parameters (InputError for a bad profile file)."""
    settings = SearchSettings(backend=backend, groups=groups, max_regress=max_regress, cost=cost or CostConfig(),
                              config=search or SearchConfig())
    return with_profile(settings, profile_path)


def train_settings(*, train_iterations: int, warmup: int, batch_size: int | None, model: str,
                   train_pipeline: PipelineKind, data: str | None, seed: int, dense_in_features: int,
                   dense_arch_layer_sizes: tuple[int, ...], over_arch_layer_sizes: tuple[int, ...],
                   dense_lr: float, embedding_lr: float, synthetic_batches: int, checkpoint_every: int,
                   checkpoint_dir: str | None, keep_checkpoints: int, resume: bool, resume_from: str | None,
                   nproc_per_node: int | None, nnodes: int, node_rank: int, rdzv_endpoint: str | None,
                   max_restarts: int) -> TrainSettings:
    """The TrainSettings of a flow's training parameters."""
    job = TrainConfig(
        iterations=train_iterations, warmup=warmup, batch_size=batch_size, model=model, pipeline=train_pipeline,
        data=data, seed=seed, dense_in_features=dense_in_features, dense_arch_layer_sizes=dense_arch_layer_sizes,
        over_arch_layer_sizes=over_arch_layer_sizes, dense_lr=dense_lr, embedding_lr=embedding_lr,
        synthetic_batches=synthetic_batches, checkpoint_every=checkpoint_every, checkpoint_dir=checkpoint_dir,
        keep_checkpoints=keep_checkpoints, resume=resume, resume_from=resume_from)
    return TrainSettings(job=job, nproc_per_node=nproc_per_node, nnodes=nnodes, node_rank=node_rank,
                         rdzv_endpoint=rdzv_endpoint, max_restarts=max_restarts)


def train_parameters(settings: TrainSettings) -> dict[str, Any]:
    """The flow parameters that give ``settings`` (for the CLI, which parses settings)."""
    out = {parameter(f.name): getattr(settings.job, f.name) for f in fields(TrainConfig)}
    out.update({f.name: getattr(settings, f.name) for f in fields(TrainSettings) if f.name != "job"})
    return out


def search_parameters(settings: SearchSettings) -> dict[str, Any]:
    """The flow parameters that give ``settings`` (but its profile: ``profile_path``)."""
    return {"backend": settings.backend, "groups": settings.groups, "max_regress": settings.max_regress,
            "cost": settings.cost, "search": settings.config}
