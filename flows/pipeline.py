"""``pipeline_flow``: the four steps — ingest the spec, search a plan, write it, train with it.

One MLflow pipeline run holds the plan and train runs nested under it. The plan is cached by
plan_id, so an unchanged re-run, or training retried after a failure, never searches again.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import flow

from flows.plan import DEFAULT_OUT, Backend
from flows.train import Model, TrainPipeline, train_with_retries
from rec.cost.types import CostConfig
from rec.search import SearchConfig
from tasks.artifact import write_plan_artifact
from tasks.ingest import ingest_spec
from tasks.mlflow_log import Logged, ParentRun, deliver_outbox, log_plan, log_training, parent_run
from tasks.search import PlannerSettings, cached_search, plan_key
from tasks.tracking import DEFAULT_EXPERIMENT, DEFAULT_STATE_DIR, tracking_for
from tasks.training import Trained, TrainSettings


@dataclass(frozen=True)
class PipelineOutcome:
    plan_id: str
    plan_path: str
    cached: bool  # the plan came from the cache: nothing was searched
    trained: Trained
    pipeline_run: ParentRun  # the parent MLflow run (run_id None while it waits in the outbox)
    plan_run: Logged
    train_run: Logged


@flow(name="shardflow-pipeline")
def pipeline_flow(
    spec_path: str,
    topology_path: str,
    backend: Backend = "local",
    groups: int | None = None,
    cost: CostConfig = CostConfig(),
    search: SearchConfig = SearchConfig(),
    train_iterations: int = 100,
    warmup: int = 10,
    batch_size: int | None = None,
    nproc_per_node: int | None = None,
    nnodes: int = 1,
    rdzv_endpoint: str | None = None,
    max_restarts: int = 0,
    train_pipeline: TrainPipeline = "sparse_dist",
    model: Model = "auto",
    data: str | None = None,
    train_retries: int = 2,
    train_retry_delay_s: float = 10.0,
    out_dir: str = DEFAULT_OUT,
    tracking_uri: str | None = None,
    experiment: str = DEFAULT_EXPERIMENT,
    state_dir: str = DEFAULT_STATE_DIR,
) -> PipelineOutcome:
    """Plan ``spec_path`` for ``topology_path`` and train with the plan; OUT_DIR/plan, OUT_DIR/train.

    The flow runs on node 0; with ``nnodes > 1`` the other nodes join the rendezvous with
    ``shardflow train --plan-id ID --node-rank K`` (see deploy/)."""
    tracking = tracking_for(tracking_uri, experiment, state_dir)
    planner = PlannerSettings(backend, groups, cost, search)
    settings = TrainSettings(train_iterations, warmup, batch_size, nproc_per_node, nnodes, 0,
                             rdzv_endpoint, max_restarts, train_pipeline, model, data)
    plan_dir, train_dir = str(Path(out_dir, "plan")), str(Path(out_dir, "train"))
    deliver_outbox(tracking)

    inputs = ingest_spec(spec_path, topology_path)                             # 1. ingest
    with parent_run(tracking, "pipeline", inputs, plan_key(inputs, planner),
                    params={"backend": backend, "train_iterations": str(train_iterations)}) as run:
        found = cached_search(inputs, planner, state_dir)                      # 2. search
        plan_path = write_plan_artifact(found.plan, plan_dir)                  # 3. validate, write
        run.plan_id = found.plan.plan_id
        plan_run = log_plan(tracking, found.plan, plan_path, inputs, run)
        trained = train_with_retries(plan_path, settings, train_dir,           # 4. train
                                     train_retries, train_retry_delay_s)
        train_run = log_training(tracking, trained, run)
    return PipelineOutcome(found.plan.plan_id, plan_path, found.cached, trained, run, plan_run,
                           train_run)
