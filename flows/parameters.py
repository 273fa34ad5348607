"""Flow parameters <-> step settings.

Prefect shows and validates a flow's own signature, so the flows list their knobs as flat, typed
parameters whose defaults are the settings dataclasses' (``TrainConfig.iterations`` ...). The
parameter names are those of the settings fields, except the few below, kept from shardflow's
first flows (deployments and scripts pass them by name).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import fields
from typing import Any

from rec.cost.types import CostConfig
from rec.search import SearchConfig
from rec.train.config import TrainConfig
from tasks.search import SearchSettings
from tasks.train import TrainSettings

TRAIN_RETRIES = 2  # Prefect retries of a failed training (flow parameter train_retries)
TRAIN_RETRY_DELAY_S = 10.0  # first retry delay; exponential backoff after it

# settings field -> flow parameter, where the two names differ
PARAMETER_NAMES = {"iterations": "train_iterations", "pipeline": "train_pipeline"}


def parameter(name: str) -> str:
    return PARAMETER_NAMES.get(name, name)


def train_settings(params: Mapping[str, Any]) -> TrainSettings:
    """The TrainSettings of a flow's parameters (those it has; the rest keep their defaults)."""
    job = {f.name: params[parameter(f.name)] for f in fields(TrainConfig) if parameter(f.name) in params}
    launch = {f.name: params[f.name] for f in fields(TrainSettings) if f.name != "job" and f.name in params}
    return TrainSettings(job=TrainConfig(**job), **launch)


def search_settings(params: Mapping[str, Any]) -> SearchSettings:
    return SearchSettings(backend=params["backend"], groups=params.get("groups"),
                          max_regress=params.get("max_regress", SearchSettings.max_regress),
                          cost=params.get("cost") or CostConfig(),
                          config=params.get("search") or SearchConfig())


def train_parameters(settings: TrainSettings) -> dict[str, Any]:
    """The flow parameters that give ``settings`` (for the CLI, which parses settings)."""
    out = {parameter(f.name): getattr(settings.job, f.name) for f in fields(TrainConfig)}
    out.update({f.name: getattr(settings, f.name) for f in fields(TrainSettings) if f.name != "job"})
    return out


def search_parameters(settings: SearchSettings) -> dict[str, Any]:
    return {"backend": settings.backend, "groups": settings.groups, "max_regress": settings.max_regress,
            "cost": settings.cost, "search": settings.config}

