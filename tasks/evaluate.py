"""``shardflow eval``: a checkpoint's model evaluated on data, on the ranks of the plan it was
trained with (``rec.train.eval_job`` under the training launcher), writing OUT/eval_metrics.json.

Before any process starts, what would fail for certain is one InputError: the checkpoint (its
index, its plan, its model.json), this machine for the plan's ranks (``tasks.train.preflight``),
and the data (its files, columns and a sample of rows, for the model's features).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rec import progress
from rec.documents import DocumentError, load_json
from rec.errors import InputError, Problem
from rec.settings import check, knob
from rec.train.config import COLLECTIVE_TIMEOUT_S, TrainConfig
from rec.train.rank_log import log_dir
from rec.units import counted
from tasks.launch import EVAL_JOB, EVAL_RDZV_ID, Launch, failure_cause, run_training
from tasks.measure import Ranks
from tasks.train import TrainingFailed, preflight


@dataclass(frozen=True)
class EvalCheckpointSettings:
    batch_size: int | None = field(default=None, metadata=TrainConfig.__dataclass_fields__["batch_size"].metadata)
    eval_batches: int = field(default=0, metadata=knob(
        "batches per rank to evaluate; 0: all of --data", minimum=0))
    ranks: Ranks = field(default_factory=Ranks)
    collective_timeout: int = field(default=COLLECTIVE_TIMEOUT_S,
                                    metadata=TrainConfig.__dataclass_fields__["collective_timeout"].metadata)

    def problems(self) -> list[Problem]:
        return self.ranks.problems()


@dataclass(frozen=True)
class Evaluated:
    out_dir: str
    metrics: dict[str, Any] | None  # eval_metrics.json (node 0)


def evaluate_checkpoint(checkpoint: str, data: str, out_dir: str,
                        settings: EvalCheckpointSettings = EvalCheckpointSettings()) -> Evaluated:
    """Evaluate the checkpoint at ``checkpoint`` on ``data``; TrainingFailed if a rank failed. The step
    evaluated is held until the ranks end: its training, going on, does not prune it meanwhile."""
    from rec.train.held_step import held_checkpoint

    check(settings, "Cannot evaluate with these settings:")
    with held_checkpoint(checkpoint) as (directory, step):
        return _evaluate(checkpoint, directory, step, data, out_dir, settings)


def _evaluate(checkpoint: str, directory: Path, step: int, data: str, out_dir: str,
              settings: EvalCheckpointSettings) -> Evaluated:
    from rec.analysis import check_plan
    from rec.data.columns import CHECKPOINT_EVALUATION
    from rec.data.schema import data_problems
    from rec.plan import read_plan
    from rec.train.checkpoint import check_index
    from rec.train.eval_job import EVAL_METRICS_FILE
    from rec.train.model_file import MODEL_FILE, read_model, unrecorded
    from rec.train.resume import PLAN_COPY, check_one_training, step_dir

    with progress.step("check", "the checkpoint, the data, and what they need of this machine"):
        missing = [name for name in (PLAN_COPY, MODEL_FILE) if not (directory / name).is_file()]
        if missing:
            raise InputError(f"Cannot evaluate the checkpoint {checkpoint}:", [Problem(str(directory),
                                                                                       unrecorded(missing))])
        plan = read_plan(directory / PLAN_COPY)
        check_plan(plan)
        model, _ = read_model(directory)
        title = f"Cannot evaluate the checkpoint {checkpoint}:"
        check_one_training(plan, model.spec, directory, title)
        at = step_dir(directory, step)
        check_index(at, model.spec, title)
        config = replace(model.config(), batch_size=settings.batch_size, collective_timeout=settings.collective_timeout)
        problems = data_problems(data, model.layout, model.ids, "--data", wording=CHECKPOINT_EVALUATION)
        try:
            nproc = preflight(replace(settings.ranks.as_training(), job=config), plan.topology)
        except InputError as e:
            problems = [*e.problems, *problems]
        if problems:
            raise InputError(f"Cannot evaluate the checkpoint {checkpoint} here:", problems)
        config = replace(config, eval_data=data, eval_batches=settings.eval_batches)
    launch = Launch(plan_path=str(directory / PLAN_COPY), out_dir=out_dir, nproc_per_node=nproc,
                    nnodes=settings.ranks.nnodes, node_rank=settings.ranks.node_rank,
                    rdzv_endpoint=settings.ranks.rdzv_endpoint, rdzv_id=EVAL_RDZV_ID,
                    join_timeout_s=settings.ranks.join_timeout, job=config,
                    module=EVAL_JOB, more_flags=(f"--checkpoint={at}",))
    with progress.step("eval", f"starting {counted(settings.ranks.nnodes * nproc, 'rank')}"):
        finished = run_training(launch)
        if finished.code != 0:
            cause = failure_cause(launch, finished)
            raise TrainingFailed(cause.text, cause.deterministic, str(log_dir(out_dir)), 1, problems=cause.problems)
    if settings.ranks.node_rank != 0:
        return Evaluated(out_dir, None)
    path = Path(out_dir) / EVAL_METRICS_FILE
    try:
        metrics: Any = load_json(path.read_text())
    except DocumentError as e:
        raise InputError(f"Cannot read {path}:", [Problem(str(path), str(e))]) from None
    return Evaluated(out_dir, metrics)
