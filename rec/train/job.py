"""The training job, one process per rank under torchrun: load the plan, never plan, shard the
model with exactly that plan, train, and report iteration latency and loss.

The model is shardflow's own, built from the plan's spec rows (``rec.train.model``: every embedding
module of the spec at its path), or the user's (``--model TARGET``, ``rec.train.user_model``).

    torchrun --nproc-per-node 2 -m rec.train.job --plan out/plan/plan.json --out out/train

Each rank writes its output to OUT/logs/rank-<RANK>.log and, if it fails, the cause to
OUT/logs/rank-<RANK>.error.json; the first rank of each node reports progress on its stdout
(``rec.train.rank_log``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.api import CheckpointException
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from rec.errors import InputError, Problem
from rec.plan import Plan, read_plan
from rec.plan.torchrec_plan import plan_modules, sharders_for, to_sharding_plan
from rec.settings import add_flags, from_flags
from rec.spec import spec_from_rows
from rec.spec.types import Spec
from rec.train import checkpoint
from rec.train.applied import applied_sharding
from rec.train.config import FAIL_AT_ENV, PipelineKind, TrainConfig
from rec.train.data import parquet_batches, synthetic_batches
from rec.train.lifetime import RunLockTaken, die_with_torchrun, join_run_lock
from rec.train.metrics import (
    Iterations,
    TrainMetrics,
    earlier_iterations,
    latency_stats,
    loss_stats,
    write_iterations,
    write_metrics,
)
from rec.train.model import build_model, resolve_model_kind
from rec.train.rank_log import RankOutput
from rec.train.resume import checkpoint_dir, step_dir

if TYPE_CHECKING:
    from torchrec.datasets.utils import Batch

    from rec.train.batch import ModuleBatch


def _refuse_to_plan(*_args: object, **_kwargs: object) -> NoReturn:
    raise RuntimeError("shardflow's training job never plans: it was given a plan artifact")


def check_world_size(plan: Plan, world_size: int) -> None:
    planned = int(plan.topology["world_size"])
    if planned != world_size:
        raise InputError("The plan does not match this job:", [
            Problem(f"plan {plan.plan_id}",
                    f"was made for world_size {planned}, the job has {world_size} processes; "
                    "replan or change --nnodes/--nproc-per-node")])


def train(plan: Plan, config: TrainConfig, out_dir: str, output: RankOutput,
          plan_path: str | None = None) -> TrainMetrics | None:
    rank, world = dist.get_rank(), dist.get_world_size()
    check_world_size(plan, world)
    cuda = plan.topology["compute_device"] == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    spec = spec_from_rows(list(plan.spec_tables))
    batch_size = config.batch_size or int(plan.topology["batch_size"])
    torch.manual_seed(config.seed)

    output.progress("building the model")
    model, batch_source = _model_and_batches(plan, spec, config, device)
    _fuse_embedding_optimizer(model, plan, config.embedding_lr)
    output.progress(f"sharding {len(plan.tables):,} tables on {world} ranks with the plan")
    dmp = DistributedModelParallel(model, device=device, plan=to_sharding_plan(plan), sharders=sharders_for(plan))
    optimizers: list[Any] = [dmp.fused_optimizer]
    dense_params = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    if dense_params:
        optimizers.append(KeyedOptimizerWrapper(dense_params,
                                                lambda params: torch.optim.Adagrad(params, lr=config.dense_lr)))
    optimizer = CombinedOptimizer(optimizers)

    start, resume = 0, None
    checkpoints = checkpoint_dir(config, out_dir)
    own = checkpoint.latest_step(checkpoints) if checkpoints else None
    resumes_own = False
    if checkpoints and own is not None and (config.resume or _restarted() or config.resume_from):
        resumes_own = True
        if own >= config.iterations:
            raise InputError("Nothing left to train:", [Problem(
                checkpoints, f"the newest checkpoint is of iteration {own}; --iterations "
                             f"{config.iterations} must be above it to train on")])
        output.progress(f"resuming from the checkpoint of iteration {own}")
        checkpoint.load(checkpoints, own, dmp, optimizer)
        start = own
    elif config.resume_from:
        start, resume = _resume_from_other_plan(config.resume_from, plan, dmp, optimizer, output)
        if checkpoints:  # the old checkpoint in this plan's layout, for restarts
            checkpoint.save(checkpoints, start, dmp, optimizer, keep=config.keep_checkpoints)
    if checkpoints and plan_path:
        checkpoint.record_plan(checkpoints, plan_path)
    earlier = Iterations.empty()
    if resumes_own and rank == 0:  # this training's rows before the checkpoint: keep them
        earlier, lost = earlier_iterations(out_dir, start)
        if lost:
            output.progress(lost)

    batches = batch_source(rank, world, batch_size)
    step_fn = _pipeline_step(dmp, optimizer, device, batches, config.pipeline)
    fail_at = _fail_at(rank)
    latencies: list[float] = []
    losses: list[torch.Tensor] = []

    def so_far() -> Iterations | None:
        """Every iteration up to now (rank 0; None on the others): a collective, all ranks call it."""
        mine = _reduced(start, latencies, losses, config.warmup)
        return earlier.then(mine) if mine is not None else None

    def keep_iterations() -> None:  # with a checkpoint: a resume from it keeps the rows before it
        rows = so_far()
        if rows is not None:
            write_iterations(out_dir, rows)

    output.progress("training", start, config.iterations)
    for i in range(start, config.iterations):
        if fail_at is not None and i == fail_at[0]:
            _fail(i, rank, fail_at[1])
        began = time.perf_counter()
        loss = step_fn()
        if cuda:
            torch.cuda.synchronize(device)
        latencies.append((time.perf_counter() - began) * 1e3)
        losses.append(loss)
        done = i + 1
        if output.due(done, config.iterations):  # the loss's .item() syncs: only when shown
            output.progress(f"iteration {done}/{config.iterations}, {latencies[-1]:.1f} ms, "
                            f"loss {loss.item():.4f}", done, config.iterations)
        if checkpoints and config.checkpoint_every and done % config.checkpoint_every == 0:
            checkpoint.save(checkpoints, done, dmp, optimizer, keep=config.keep_checkpoints,
                            before_latest=keep_iterations)

    rows = so_far()
    if rows is None:
        return None
    stats = latency_stats(rows.measured_ms())
    metrics = TrainMetrics(
        plan_id=plan.plan_id, world_size=world, iterations=config.iterations,
        warmup=config.warmup, batch_size=batch_size, pipeline=config.pipeline.value,
        model=config.model_target or resolve_model_kind(spec, config.model_kind).value, iteration_latency_ms=stats,
        loss=loss_stats(rows.loss), samples_per_s=world * batch_size / (stats.mean / 1e3),
        applied_sharding=applied_sharding(dmp), resumed_from=start, resume=resume,
        predicted_critical_path_ms=plan.metrics.critical_path,
    )
    write_metrics(out_dir, metrics, rows)
    return metrics


def _model_and_batches(plan: Plan, spec: Spec, config: TrainConfig, device: torch.device) -> tuple[
        torch.nn.Module, Callable[[int, int, int], Iterator[Batch | ModuleBatch]]]:
    """The model to shard (embedding modules on meta) and where this rank's batches come from."""
    cuda = device.type == "cuda"
    if config.model_target:
        from rec.train.user_model import check_user_model

        user = check_user_model(config.model_target, spec)
        return user.model, lambda rank, world, batch_size: iter(user.batches(rank, world, batch_size, device))
    model = build_model(spec, config, device)
    if config.data:
        data = config.data
        return model, lambda rank, world, batch_size: parquet_batches(
            data, spec, batch_size, config.dense_in_features, rank, world, cuda)
    return model, lambda rank, world, batch_size: synthetic_batches(
        spec, batch_size, config.dense_in_features, config.seed + rank, config.synthetic_batches, cuda)


def _fuse_embedding_optimizer(model: torch.nn.Module, plan: Plan, lr: float) -> None:
    """Fused row-wise Adagrad on every planned embedding module's tables (applied in backward, as
    the sharded kernels run it), unless the model's own code already chose an optimizer for them."""
    for path in plan_modules(plan):
        params = [p for p in model.get_submodule(path).parameters() if not hasattr(p, "_optimizer_classes")]
        if params:
            apply_optimizer_in_backward(RowWiseAdagrad, params, {"lr": lr})


def _reduced(start: int, latencies: list[float], losses: list[torch.Tensor], warmup: int) -> Iterations | None:
    """This run's iterations over all ranks (a collective): an iteration takes as long as its
    slowest rank, its loss is the mean over the ranks. Rank 0 gets them, the others None."""
    local = torch.tensor(latencies, dtype=torch.float64)
    dist.all_reduce(local, op=dist.ReduceOp.MAX)
    total = torch.stack(losses).to(torch.float64) if losses else torch.zeros(0, dtype=torch.float64)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
    if dist.get_rank() != 0:
        return None
    return Iterations.of_run(start, local.numpy(), total.cpu().numpy() / dist.get_world_size(), warmup)


def _resume_from_other_plan(path: str, plan: Plan, dmp: DistributedModelParallel, optimizer: CombinedOptimizer,
                            output: RankOutput) -> tuple[int, dict[str, Any]]:
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
    return source.step, {
        "from_plan_id": source.plan.plan_id, "step": source.step,
        "tables_restored": len(changes.restored), "tables_resized": len(changes.resized),
        "tables_initialized": len(changes.added) + len(changes.reinitialized),
        "reinitialized": list(changes.reinitialized), "dense_reinitialized": dense,
    }


def _pipeline_step(dmp: DistributedModelParallel, optimizer: CombinedOptimizer, device: torch.device,
                   batches: Iterator[Batch | ModuleBatch], kind: PipelineKind) -> Callable[[], torch.Tensor]:
    """One training iteration as a function returning its (detached) loss. The model's forward
    returns ``(losses, output)``, TorchRec's convention (``DLRMTrain``): backward runs on the sum
    of ``losses``, which is the loss reported."""
    loss = torch.zeros(())

    def forward(batch: Batch | ModuleBatch) -> Any:
        nonlocal loss
        output = dmp(batch)
        loss = _losses(output).detach().sum()
        return output

    if kind is PipelineKind.SPARSE_DIST:
        pipeline = TrainPipelineSparseDist(dmp, optimizer, device, custom_model_fwd=forward)

        def pipelined() -> torch.Tensor:
            pipeline.progress(batches)  # returns the forward's output; the loss is kept by forward
            return loss

        return pipelined

    def naive() -> torch.Tensor:
        batch = next(batches).to(device, non_blocking=True)
        optimizer.zero_grad()
        losses, _ = forward(batch)
        torch.autograd.backward(torch.sum(losses, dim=0))
        optimizer.step()
        return loss

    return naive


def _losses(output: Any) -> torch.Tensor:
    """The ``losses`` of a forward's ``(losses, output)``; InputError for anything else."""
    losses = output[0] if isinstance(output, (tuple, list)) and len(output) == 2 else None
    if not isinstance(losses, torch.Tensor) or losses.dim() > 1:
        raise InputError("The model's forward does not return (loss, output):", [Problem(
            "forward(batch)", f"returned {type(output).__name__}{_shape(losses)}; return (loss, output), as "
                              "TorchRec's DLRMTrain and train pipelines do")])
    return losses


def _shape(value: Any) -> str:
    return f" with a loss of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""


def _restarted() -> bool:
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")) > 0


def _fail_at(rank: int) -> tuple[int, str] | None:
    """Fault injection (tests): ``ITER:RANK`` kills the rank at that iteration, ``ITER:RANK:raise``
    raises there instead."""
    spec = os.environ.get(FAIL_AT_ENV)
    if not spec or _restarted():
        return None
    iteration, _, rest = spec.partition(":")
    fail_rank, _, how = rest.partition(":")
    return (int(iteration), how) if int(fail_rank or 0) == rank else None


def _fail(iteration: int, rank: int, how: str) -> None:
    if how == "raise":
        raise RuntimeError(f"injected failure at iteration {iteration} on rank {rank}")
    os._exit(17)  # a crashed rank, for the restart test


def init_process_group(backend: str) -> None:
    """The default process group on a store prefixed by torchrun's restart count.

    After a rank dies and torchrun restarts the workers, env:// can hand the new workers the dead
    workers' gloo addresses (stale keys in the reused store) and the restart fails to connect; a
    prefix per attempt gives every restart fresh keys."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent_hosts_store and rank == 0, multi_tenant=True)
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    dist.init_process_group(backend, store=dist.PrefixStore(f"shardflow/attempt_{attempt}", store),
                            rank=rank, world_size=world)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, TrainConfig]:
    p = argparse.ArgumentParser(prog="rec.train.job", description=__doc__)
    p.add_argument("--plan", required=True)
    p.add_argument("--out", required=True)
    add_flags(p, TrainConfig)
    a = p.parse_args(argv)
    return a, from_flags(TrainConfig, a)


def main(argv: list[str] | None = None) -> int:
    args, config = parse_args(argv)
    if not die_with_torchrun():
        print("shardflow train: torchrun, this rank's parent, is gone; not starting", file=sys.stderr)
        return 1
    try:
        join_run_lock()  # held until this process ends
    except RunLockTaken as e:
        print(f"shardflow train: {e}; not starting", file=sys.stderr)
        return 1
    output = RankOutput(args.out, int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
                        os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    try:
        output.progress("loading the plan")
        plan = read_plan(args.plan)
        EmbeddingShardingPlanner.plan = _refuse_to_plan
        EmbeddingShardingPlanner.collective_plan = _refuse_to_plan
        init_process_group("nccl" if plan.topology["compute_device"] == "cuda" else "gloo")
        try:
            train(plan, config, args.out, output, args.plan)
        finally:
            dist.destroy_process_group()
    except InputError as e:
        output.failed(e)
        print(f"shardflow train: {e.render()}", file=sys.stderr)
        return 2
    except (Exception, CheckpointException) as e:  # DCP's CheckpointException is a BaseException
        output.failed(e)
        traceback.print_exc()
        return 1
    return 0


def exit_skipping_finalization(code: int) -> None:
    """Leave without interpreter finalization once every output is written.

    Gloo's worker threads release a finished collective's tensors a moment after the caller
    wakes up; if that release lands during finalization it needs the GIL, the thread is torn
    down inside C++ and the process aborts ("terminate called without an active exception"),
    failing a job that finished. Skipping finalization removes that race."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_skipping_finalization(main())
