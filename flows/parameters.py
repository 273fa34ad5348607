"""Flow parameters <-> step settings.

Prefect shows and validates a flow's own signature, so a step's settings are a flow parameter
whole, under one name — ``cost`` (``CostConfig``), ``search`` (``SearchConfig``), ``training``
(``TrainSettings``, the job's knobs in ``training.job``) — and a knob added to a settings dataclass
is a parameter of every flow that takes it, and of their deployments, with no other edit and by
its own name: ``--iterations`` on the command line is ``training.job.iterations`` in a flow.

Before ``training`` the flows took the training knobs as flat parameters, two of them renamed
(``train_iterations``, ``train_pipeline``). Deployments and scripts pass them by name, so the flows
still accept them, deprecated (``DEPRECATED_TRAINING``, a closed list: a new knob gets no flat
name), and ``with_deprecated`` sets them in ``training``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from rec.cost.types import CostConfig
from rec.errors import InputError, Problem
from rec.search import SearchConfig
from rec.train.config import TrainConfig
from tasks.backend import Backend
from tasks.search import SearchSettings, with_profile
from tasks.train import TrainSettings

log = logging.getLogger(__name__)

TRAINING = "training"  # the flows' parameter holding the TrainSettings
# The flat parameters of shardflow's first flows -> the field of TrainSettings each one sets.
DEPRECATED_TRAINING: Mapping[str, tuple[str, ...]] = {
    "train_iterations": ("job", "iterations"),
    "train_pipeline": ("job", "pipeline"),
    **{name: ("job", name) for name in (
        "warmup", "batch_size", "model", "data", "seed", "dense_in_features", "dense_arch_layer_sizes",
        "over_arch_layer_sizes", "dense_lr", "embedding_lr", "synthetic_batches", "checkpoint_every",
        "checkpoint_dir", "keep_checkpoints", "resume", "resume_from")},
    **{name: (name,) for name in ("nproc_per_node", "nnodes", "node_rank", "rdzv_endpoint", "max_restarts")},
}


def deprecated_target(name: str) -> str | None:
    """``train_iterations`` -> ``training.job.iterations``: where a deprecated flat parameter goes."""
    path = DEPRECATED_TRAINING.get(name)
    return ".".join((TRAINING, *path)) if path else None


def search_settings(*, backend: Backend, groups: int | None, max_regress: float, cost: CostConfig | None,
                    search: SearchConfig | None, profile_path: str | None) -> SearchSettings:
    """The SearchSettings of a flow's search parameters (InputError for a bad profile file)."""
    settings = SearchSettings(backend=backend, groups=groups, max_regress=max_regress, cost=cost or CostConfig(),
                              config=search or SearchConfig())
    return with_profile(settings, profile_path)


def search_parameters(settings: SearchSettings) -> dict[str, Any]:
    """The flow parameters that give ``settings`` (but its profile: ``profile_path``)."""
    return {"backend": settings.backend, "groups": settings.groups, "max_regress": settings.max_regress,
            "cost": settings.cost, "search": settings.config}


def with_deprecated(training: TrainSettings, parameters: Mapping[str, Any]) -> TrainSettings:
    """``training`` with each deprecated flat parameter among ``parameters`` (a flow's own, by
    name) that was given (not None) set in it, with a warning naming its new name; InputError
    where ``training`` itself sets that field to another value."""
    job: dict[str, Any] = {}
    processes: dict[str, Any] = {}
    problems = []
    for name, path in DEPRECATED_TRAINING.items():
        value = parameters.get(name)
        if value is None:
            continue
        owner, default = (training.job, TrainConfig()) if path[0] == "job" else (training, TrainSettings())
        current = getattr(owner, path[-1])
        if current not in (getattr(default, path[-1]), value):
            problems.append(Problem(name, f"is the deprecated name of {deprecated_target(name)}, given "
                                          f"{current!r} as well; give one of the two"))
        (job if path[0] == "job" else processes)[path[-1]] = value
    if problems:
        raise InputError("Conflicting training parameters:", problems)
    if job or processes:
        _logger().warning("deprecated flow parameters: %s", ", ".join(
            f"{name} (now {deprecated_target(name)})" for name in DEPRECATED_TRAINING
            if parameters.get(name) is not None))
    return replace(training, job=replace(training.job, **job), **processes)


def _logger() -> logging.Logger | logging.LoggerAdapter[logging.Logger]:
    """The flow run's logger (its log in Prefect), or this module's outside a flow run."""
    from prefect import get_run_logger
    from prefect.exceptions import MissingContextError

    try:
        return get_run_logger()
    except MissingContextError:
        return log
