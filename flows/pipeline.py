"""``pipeline_flow``: the four steps — ingest the spec, search a plan, write it, train with it.

One MLflow pipeline run holds the plan and train runs nested under it, and carries their headline
(the plan's params and metrics, the training's latency and samples/s). The plan is cached by
plan_id, so an unchanged re-run, or training retried after a failure, never searches again. A
pipeline that fails ends FAILED with the cause (``shardflow.error``); a failed training also
leaves a FAILED train run with the ranks' logs.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from prefect import flow, get_run_logger

from flows.plan import plan_summary
from flows.reports import checkpoint_lines, data_lines, predicted_line, resumed_lines
from flows.start import Ingested, inputs_for, started
from flows.train import train_with_retries
from rec.errors import InputError, Problem
from rec.plan import read_plan
from rec.plan.chart import CHART_FILE
from rec.settings import check
from rec.train.metrics import METRICS_FILE
from tasks.mlflow_log import Logged, ParentRun, log_plan, log_training, parent_run
from tasks.records import RunStep
from tasks.run_dirs import RunDirs
from tasks.search import SearchSettings, plan_key, with_profile
from tasks.steps import search_task, write_task
from tasks.tracking import TrackingSettings
from tasks.train import TRAIN_RETRIES, TRAIN_RETRY_DELAY_S, Trained, TrainSettings
from tasks.write import WriteSettings


@dataclass(frozen=True)
class PipelineOutcome:
    plan_id: str
    plan_path: str
    cached: bool  # the plan came from the cache: nothing was searched
    trained: Trained
    pipeline_run: ParentRun  # the parent MLflow run (run_id None while it waits in the outbox)
    plan_run: Logged
    train_run: Logged

    def summary(self) -> str:
        """The plan and training lines ``shardflow run`` prints first and the flow run's log ends with."""
        m = self.trained.metrics
        assert m is not None, "the pipeline trains on one node: it has the metrics"
        lat = m.iteration_latency_ms
        chart = Path(self.plan_path).parent / CHART_FILE
        return "\n".join([
            f"{plan_summary(self.plan_path, self.plan_id, self.cached)}; chart {chart}",
            f"training  {Path(self.trained.out_dir) / METRICS_FILE}: p50 {lat.p50:.2f} ms, "
            f"p90 {lat.p90:.2f} ms, {m.samples_per_s:,.0f} samples/s on {m.world_size} ranks"
            + f", loss {m.loss.first:.4f} -> {m.loss.last:.4f}"
            + (f" ({self.trained.attempts} attempts)" if self.trained.attempts > 1 else ""),
            predicted_line(read_plan(self.plan_path), m),
            *resumed_lines(self.trained),
            *data_lines(m),
            *checkpoint_lines(self.trained),
        ])


@flow(name="shardflow-pipeline")
def pipeline_flow(
    spec_path: str,
    topology_path: str,
    searching: SearchSettings = SearchSettings(),
    chart: bool = WriteSettings.chart,
    training: TrainSettings = TrainSettings(),
    train_retries: int = TRAIN_RETRIES,
    train_retry_delay_s: float = TRAIN_RETRY_DELAY_S,
    out_dir: str | None = None,
    tracking: TrackingSettings = TrackingSettings(),
    work_dir: str | None = None,
    ingested: Ingested | None = None,
) -> PipelineOutcome:
    """Plan ``spec_path`` for ``topology_path`` as ``searching`` says and train with the plan as
    ``training`` says. Output: OUT_DIR/plan and OUT_DIR/train (OUT_DIR locked for the run), or
    without ``out_dir`` out/<plan_id>/plan and a new out/<plan_id>/train-<time>.

    The flow runs on node 0; with ``training.nnodes > 1`` the other nodes join the rendezvous with
    ``shardflow train --plan-id ID --node-rank K`` (see deploy/)."""
    if training.node_rank != 0:
        raise InputError("The pipeline trains on node 0:", [Problem(
            "training.node_rank", f"is {training.node_rank}; the other nodes join with shardflow train "
                                  "--plan-id ID --node-rank K")])
    check(training, "Cannot train with these settings:")
    searching = with_profile(searching)
    dirs = RunDirs.of(out_dir, work_dir)

    with started(tracking, work_dir) as start:
        inputs = inputs_for(spec_path, topology_path, ingested)                     # 1. ingest
        with dirs.locked(), parent_run(start.tracking, RunStep.PIPELINE, inputs, plan_key(inputs, searching),
                                       params={"backend": searching.backend.value,
                                               "train_iterations": str(training.job.iterations)}) as run:
            found = search_task(inputs, searching, start.plan_cache_dir)           # 2. search
            plan_id = found.plan.plan_id
            written = write_task(found.plan, dirs.plan_dir(plan_id), WriteSettings(chart))  # 3. write
            run.add_plan(found.plan)
            plan_run = log_plan(start.tracking, found.plan, written.plan_path, inputs, run, found.seconds)
            train_dir = dirs.train_dir(plan_id)
            trained = train_with_retries(plan_id, written.plan_path, train_dir,    # 4. train
                                         training, train_retries, train_retry_delay_s, start.tracking, run)
            dirs.mark_latest(train_dir)
            run.add_training(trained)
            train_run = log_training(start.tracking, trained, run, inputs)
    outcome = PipelineOutcome(found.plan.plan_id, written.plan_path, found.cached, trained, run, plan_run, train_run)
    get_run_logger().info(outcome.summary())
    return outcome
