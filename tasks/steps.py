"""The four steps as Prefect tasks: thin wrappers that add names, retries and progress.

Each step is a plain function (``tasks.ingest``, which reads its two files and has no settings;
``tasks.search``, ``tasks.write``, ``tasks.train``, each with one settings dataclass); the CLI calls
those functions directly, the flows call these.
"""

from __future__ import annotations

from prefect import task
from prefect.cache_policies import NO_CACHE
from prefect.runtime import task_run
from prefect.tasks import exponential_backoff

from rec.plan import Plan
from tasks.ingest import Inputs, ingest
from tasks.retry import worth_retrying
from tasks.search import Found, SearchSettings, search_plan
from tasks.step_progress import ingesting, searching, writing
from tasks.train import TRAIN_RETRIES, TRAIN_RETRY_DELAY_S, Trained, TrainSettings, train
from tasks.write import WriteSettings, Written, write_plan_artifact


@task(name="ingest-spec", cache_policy=NO_CACHE)
def ingest_task(spec_path: str, topology_path: str) -> Inputs:
    """Read, validate and hash the spec and the topology (an InputError is never retried)."""
    with ingesting(spec_path):
        return ingest(spec_path, topology_path)


@task(name="search-plan", cache_policy=NO_CACHE, retries=2,
      retry_delay_seconds=exponential_backoff(backoff_factor=2), retry_condition_fn=worth_retrying)
def search_task(inputs: Inputs, settings: SearchSettings, cache_dir: str | None,
                previous: Plan | None = None) -> Found:
    """Search (or take from the plan cache) and merge, from ``previous`` when given; retried with
    backoff (a lost Ray cluster, a dead driver), but not for an InputError such as tables that fit
    no rank."""
    with searching(inputs, settings):
        return search_plan(inputs, settings, cache_dir, previous)


@task(name="write-plan", cache_policy=NO_CACHE)
def write_task(plan: Plan, out_dir: str, settings: WriteSettings) -> Written:
    """Validate and write plan.json, shards.parquet and the chart."""
    with writing(out_dir):
        return write_plan_artifact(plan, out_dir, settings)


@task(name="launch-training", cache_policy=NO_CACHE, retries=TRAIN_RETRIES,
      retry_delay_seconds=exponential_backoff(backoff_factor=TRAIN_RETRY_DELAY_S), retry_condition_fn=worth_retrying)
def train_task(plan_path: str, out_dir: str, settings: TrainSettings) -> Trained:
    """Run torchrun on this node to completion; a failed rank is retried with the same plan,
    unless the failure would repeat (bad input, a machine without what the plan needs)."""
    return train(plan_path, out_dir, settings, attempt=task_run.run_count)
