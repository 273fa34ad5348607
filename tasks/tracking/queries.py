"""Finding shardflow's runs in MLflow by their tags: the run of a record, runs of a step or plan,
the last planning of a spec file, a plan's files."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from rec.errors import InputError, Problem
from rec.plan.io import PLAN_FILE, PLAN_FILES
from tasks.records import RECORD, SPEC_PATH, STEP, TOPOLOGY_HASH, RunStatus, RunStep

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run


def quoted(value: str) -> str:
    """``value`` as a string of an MLflow search filter, in single quotes, or double ones where it holds a
    single quote (a spec file named team's.yaml); InputError where it holds both."""
    for quote in ("'", '"'):
        if quote not in value:
            return f"{quote}{value}{quote}"
    raise InputError("Cannot search MLflow for this value:", [Problem(value, "contains both kinds of quote")])


def run_of_record(client: MlflowClient, experiment_id: str, key: str) -> Run | None:
    """The run a complete delivery of record ``key`` made, if any."""
    runs = client.search_runs([experiment_id], f"tags.`{RECORD}` = {quoted(key)}", max_results=1)
    return runs[0] if runs else None


def find_runs(client: MlflowClient, experiment_ids: list[str], step: RunStep | None = None,
              finished: bool = False, max_results: int = 1000, **tags: str) -> list[Run]:
    """Runs newest first, filtered by ``shardflow.<name>`` tags (e.g. ``plan_id=...``)."""
    clauses = [f"tags.`{STEP}` = '{step}'"] if step else []
    clauses += [f"tags.`shardflow.{name}` = {quoted(value)}" for name, value in tags.items()]
    if finished:
        clauses.append(f"attributes.status = '{RunStatus.FINISHED}'")
    return list(client.search_runs(experiment_ids, " and ".join(clauses),
                                   max_results=max_results, order_by=["attributes.start_time DESC"]))


def last_planning(client: MlflowClient, experiment_id: str, spec_path: str,
                  topology_hash: str) -> Run | None:
    """The newest finished run that planned this spec file on this topology (plan, pipeline or
    replan: all carry ``shardflow.spec_hash``)."""
    runs = client.search_runs(
        [experiment_id],
        f"tags.`{SPEC_PATH}` = {quoted(spec_path)} and tags.`{TOPOLOGY_HASH}` = {quoted(topology_hash)}"
        f" and attributes.status = '{RunStatus.FINISHED}'",
        max_results=1, order_by=["attributes.start_time DESC"])
    return runs[0] if runs else None


def download_plan(client: MlflowClient, experiment_id: str, plan_id: str, dest: Path) -> Path | None:
    """plan.json and shards.parquet of the finished plan run of ``plan_id`` into ``dest``."""
    runs = find_runs(client, [experiment_id], step=RunStep.PLAN, plan_id=plan_id, finished=True,
                     max_results=1)
    if not runs:
        return None
    dest.mkdir(parents=True, exist_ok=True)
    run_id = runs[0].info.run_id
    for name in PLAN_FILES:
        client.download_artifacts(run_id, name, str(dest))
    return dest / PLAN_FILE
