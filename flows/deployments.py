"""The deployments of ``deploy/prefect.yaml`` as Prefect ``RunnerDeployment``s, for ``shardflow
serve``: one file declares them for both ``prefect deploy`` and serving."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import TYPE_CHECKING

import yaml

from rec.errors import InputError, Problem

if TYPE_CHECKING:
    from prefect.deployments.runner import RunnerDeployment

ROOT = Path(__file__).resolve().parents[1]
PREFECT_FILE = ROOT / "deploy" / "prefect.yaml"


def read_deployments(prefect_file: str | Path = PREFECT_FILE) -> list[dict]:
    """The ``deployments`` entries of a prefect.yaml; InputError naming what is wrong."""
    path = Path(prefect_file)
    try:
        doc = yaml.safe_load(path.read_text()) or {}
    except (OSError, yaml.YAMLError) as e:
        raise InputError("Cannot read the Prefect deployments:", [Problem(str(path), str(e))]) from None
    entries = doc.get("deployments") or []
    problems = [Problem(f"{path}: deployment {i}", f"needs {key!r}")
                for i, d in enumerate(entries) for key in ("name", "entrypoint") if key not in d]
    if not entries:
        problems.append(Problem(str(path), "declares no deployments"))
    if problems:
        raise InputError("Cannot use the Prefect deployments:", problems)
    return entries


def load_flow(entrypoint: str):
    """``flows/plan.py:plan_flow`` -> the flow object, imported as ``flows.plan``."""
    file, _, name = entrypoint.partition(":")
    module = importlib.import_module(file.removesuffix(".py").replace("/", "."))
    return getattr(module, name)


def runner_deployments(prefect_file: str | Path = PREFECT_FILE) -> list[RunnerDeployment]:
    """Each deployment with its parameters, tags and cron/interval schedules (work pools are for
    workers; serving runs the flows in this process's subprocesses)."""
    from prefect.schedules import Cron, Interval
    from prefect.types.entrypoint import EntrypointType

    out = []
    for d in read_deployments(prefect_file):
        schedules = [Cron(s["cron"], timezone=s.get("timezone"), active=s.get("active", True))
                     if "cron" in s else Interval(s["interval"], timezone=s.get("timezone"))
                     for s in d.get("schedules") or []]
        out.append(load_flow(d["entrypoint"]).to_deployment(
            name=d["name"], description=d.get("description"), tags=d.get("tags"),
            parameters=d.get("parameters") or {}, schedules=schedules,
            entrypoint_type=EntrypointType.MODULE_PATH))
    return out
