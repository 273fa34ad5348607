"""Where a training starts: at iteration 0, at its own newest checkpoint (``--resume``, or a rank
restarted by torchrun), or at another plan's checkpoint resharded into this plan's layout
(``--resume-from``); the model and optimizer are loaded in place, and the data is read on from the
checkpoint's position (``rec.train.feed``)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper

from rec.evaluation.metrics import Evaluation
from rec.plan import Plan
from rec.train import checkpoint
from rec.train.config import TrainConfig
from rec.train.feed import Feed, read_position
from rec.train.metrics import Earlier, Iterations, Resumed, earlier_iterations
from rec.train.ownership import Run, another_runs
from rec.train.rank_log import RankOutput
from rec.train.rank_process import restart_count
from rec.train.resume import beyond_iterations, checkpoint_dir, latest, step_dir


@dataclass(frozen=True)
class Start:
    iteration: int  # the first iteration this run trains
    resume: Resumed | None  # from another plan's checkpoint: what carried over (train_metrics.json)
    earlier: Iterations  # rank 0 resuming its own checkpoint: the rows of the iterations before it
    run: Run  # this run: the writer of every checkpoint it writes
    resumed_run: Run | None = None  # the run whose checkpoint this one continues, when another's
    earlier_evaluations: tuple[Evaluation, ...] = ()  # rank 0, as ``earlier``: the evaluations before it


def start(plan: Plan, config: TrainConfig, out_dir: str, dmp: DistributedModelParallel,
          optimizer: CombinedOptimizer, output: RankOutput, plan_path: str | None, feed: Feed,
          run: Run) -> Start:
    """Load the checkpoint this training starts from, if any, set ``feed`` to read on from its data
    position, and record the plan the checkpoints are written under (``plan_path``); checkpoints it
    writes are ``run``'s. InputError when the checkpoint leaves nothing to train."""
    iteration, resume, own, other = 0, None, False, None
    checkpoints = checkpoint_dir(config, out_dir)
    newest = latest(checkpoints) if checkpoints else None
    if checkpoints and newest is not None and (config.resume or restart_count() > 0 or config.resume_from):
        own = True
        if newest > config.iterations:  # at it: a training stopped before its outputs, finished now
            raise beyond_iterations(checkpoints, newest, config.iterations)
        other = another_runs(step_dir(checkpoints, newest), run)
        output.progress(f"resuming from the checkpoint of iteration {newest}"
                        + (f" that {other.describe()} wrote" if other else ""))
        _make_lazy_state(optimizer)
        checkpoint.load(checkpoints, newest, dmp, optimizer)
        iteration = newest
        _read_on(feed, iteration, step_dir(checkpoints, newest), output)
    elif config.resume_from:
        _make_lazy_state(optimizer)
        iteration, resume, source_step = _from_other_plan(config.resume_from, plan, dmp, optimizer, output)
        _read_on(feed, iteration, source_step, output)
        if checkpoints:  # the old checkpoint in this plan's layout, for restarts
            at = step_dir(checkpoints, iteration)
            checkpoint.save(checkpoints, iteration, dmp, optimizer, keep=config.keep_checkpoints, written_by=run,
                            before_latest=lambda: _keep_position(feed, iteration, at))
    if checkpoints and plan_path:
        checkpoint.record_plan(checkpoints, plan_path)
    earlier = Earlier(Iterations.empty())
    if own and dist.get_rank() == 0:  # this training's rows and evaluations before the checkpoint: keep them
        earlier = earlier_iterations(out_dir, iteration)
        if earlier.lost:
            print(earlier.lost, flush=True)  # into the rank's log, which outlives the progress line
            output.progress(earlier.lost)
    evaluations = tuple(Evaluation.from_dict(e) for e in earlier.evaluations)
    return Start(iteration, resume, earlier.iterations, run, other, evaluations)


def _make_lazy_state(optimizer: CombinedOptimizer) -> None:
    """Make the state of each optimizer that makes it at its first step (a user's model's dense
    optimizers: torch's Adam, SGD with momentum), so that a checkpoint's is loaded into it, by
    TorchRec's step of zero gradients; the parameters that step moved (weight decay) are put back."""
    for _, keyed in optimizer.optimizers:
        if keyed.state or not isinstance(keyed, KeyedOptimizerWrapper):  # the tables' kernels make theirs at once
            continue
        params = [p for p in keyed.params.values() if p.requires_grad]
        with torch.no_grad():
            kept = [p.detach().clone() for p in params]
            keyed.init_state()
            for p, value in zip(params, kept, strict=True):
                p.copy_(value)
                p.grad = None


def _read_on(feed: Feed, iteration: int, step: Path, output: RankOutput) -> None:
    note = feed.resume_at(iteration, read_position(step), dist.get_world_size())
    if note:
        print(note, flush=True)  # the rank's log; train_metrics.json's data.resumed and the summary say it too
        output.progress(note)


def _keep_position(feed: Feed, iteration: int, step: Path) -> None:
    if dist.get_rank() == 0:
        feed.keep_position(step, iteration)


def _from_other_plan(path: str, plan: Plan, dmp: DistributedModelParallel, optimizer: CombinedOptimizer,
                     output: RankOutput) -> tuple[int, Resumed, Path]:
    """Load the newest checkpoint of a training with another plan into this plan's layout."""
    from rec.train.reshard import is_table_tensor, load_resharded
    from rec.train.resume import check_resume, resume_source, table_changes

    source = resume_source(path)
    check_resume(source, plan)
    changes = table_changes(source.plan, plan)
    output.progress(f"resuming plan {plan.plan_id} from plan {source.plan.plan_id}'s checkpoint of "
                    f"iteration {source.step}")
    step = step_dir(source.checkpoint_dir, source.step)
    checkpoint.check_index(step)  # refused: InputError, before DCP reads it
    report = load_resharded(step, dmp, optimizer, changes.resized)
    tables = [t.key for t in plan.tables]
    dense = sorted(k.removeprefix("model.") for k in report.initialized
                   if not k.startswith("optim.") and not is_table_tensor(k, tables))
    if changes.reinitialized or dense:
        output.progress(f"re-initialized (shape changed): tables {list(changes.reinitialized)}, dense {dense}")
    return source.step, Resumed(
        from_plan_id=source.plan.plan_id, step=source.step, tables_restored=len(changes.restored),
        tables_resized=len(changes.resized), tables_initialized=len(changes.added) + len(changes.reinitialized),
        reinitialized=tuple(changes.reinitialized), dense_reinitialized=tuple(dense)), step
