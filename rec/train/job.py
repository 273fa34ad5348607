"""The training job, one process per rank under torchrun: load the plan, never plan, shard the
model with exactly that plan, train, and report iteration latency and loss.

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
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import numpy as np
import torch
import torch.distributed as dist
from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.planner import EmbeddingShardingPlanner
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from rec.errors import InputError, Problem
from rec.plan import Plan, read_plan
from rec.plan.torchrec_plan import to_sharding_plan
from rec.settings import add_flags, from_flags
from rec.spec import spec_from_rows
from rec.train import checkpoint
from rec.train.config import FAIL_AT_ENV, PipelineKind, TrainConfig
from rec.train.data import parquet_batches, synthetic_batches
from rec.train.metrics import TrainMetrics, latency_stats, loss_stats, write_metrics
from rec.train.model import EBC_PATH, build_model, resolve_model_kind
from rec.train.rank_log import RankOutput

if TYPE_CHECKING:
    from torchrec.datasets.utils import Batch


def _refuse_to_plan(*_args: object, **_kwargs: object) -> NoReturn:
    raise RuntimeError("shardflow's training job never plans: it was given a plan artifact")


def check_world_size(plan: Plan, world_size: int) -> None:
    planned = int(plan.topology["world_size"])
    if planned != world_size:
        raise InputError("The plan does not match this job:", [
            Problem(f"plan {plan.plan_id}",
                    f"was made for world_size {planned}, the job has {world_size} processes; "
                    "replan or change --nnodes/--nproc-per-node")])


def applied_sharding(model: torch.nn.Module) -> dict[str, str]:
    """Sharding type per table as the sharded module reports it (not as the plan says)."""
    from torchrec.distributed.embeddingbag import ShardedEmbeddingBagCollection

    for module in model.modules():
        if isinstance(module, ShardedEmbeddingBagCollection):
            return {name: ps.sharding_type for name, ps in module.module_sharding_plan.items()}
    return {}


def checkpoint_dir(config: TrainConfig, out_dir: str) -> str | None:
    """Where checkpoints are written and read; None when the job neither writes nor resumes."""
    if config.checkpoint_dir:
        return config.checkpoint_dir
    if config.checkpoint_every or config.resume:
        return str(Path(out_dir) / "checkpoints")
    return None


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
    model = build_model(spec, config, device)
    apply_optimizer_in_backward(RowWiseAdagrad, model.model.sparse_arch.parameters(),
                                {"lr": config.embedding_lr})
    output.progress(f"sharding {len(plan.tables):,} tables on {world} ranks with the plan")
    dmp = DistributedModelParallel(model, device=device, plan=to_sharding_plan(plan, EBC_PATH),
                                   sharders=[EmbeddingBagCollectionSharder()])
    dense = KeyedOptimizerWrapper(dict(in_backward_optimizer_filter(dmp.named_parameters())),
                                  lambda params: torch.optim.Adagrad(params, lr=config.dense_lr))
    optimizer = CombinedOptimizer([dmp.fused_optimizer, dense])

    start, resume = 0, None
    checkpoints = checkpoint_dir(config, out_dir)
    own = checkpoint.latest_step(checkpoints) if checkpoints else None
    if checkpoints and own is not None and (config.resume or _restarted() or config.resume_from):
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

    batches = (parquet_batches(config.data, spec, batch_size, config.dense_in_features, rank, world, cuda)
               if config.data else
               synthetic_batches(spec, batch_size, config.dense_in_features, config.seed + rank,
                                 config.synthetic_batches, cuda))
    step_fn = _pipeline_step(dmp, optimizer, device, batches, config.pipeline)
    fail_at = _fail_at(rank)
    latencies, losses = [], []
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
            checkpoint.save(checkpoints, done, dmp, optimizer, keep=config.keep_checkpoints)

    # An iteration takes as long as its slowest rank; its loss is the mean over the ranks.
    local = torch.tensor(latencies, dtype=torch.float64)
    dist.all_reduce(local, op=dist.ReduceOp.MAX)
    mean_loss = torch.stack(losses).to(torch.float64) if losses else torch.zeros(0, dtype=torch.float64)
    dist.all_reduce(mean_loss, op=dist.ReduceOp.SUM)
    if rank != 0:
        return None
    iterations = np.arange(start, config.iterations)
    all_ms, all_loss = local.numpy(), mean_loss.cpu().numpy() / world
    measured = all_ms[iterations >= config.warmup]
    if not len(measured):  # resumed after the warm-up window: every iteration here counts
        measured = all_ms
    stats = latency_stats(measured)
    metrics = TrainMetrics(
        plan_id=plan.plan_id, world_size=world, iterations=config.iterations,
        warmup=config.warmup, batch_size=batch_size, pipeline=config.pipeline.value,
        model=resolve_model_kind(spec, config.model).value, iteration_latency_ms=stats,
        loss=loss_stats(all_loss), samples_per_s=world * batch_size / (stats.mean / 1e3),
        applied_sharding=applied_sharding(dmp), resumed_from=start, resume=resume,
    )
    write_metrics(out_dir, metrics, iterations, all_ms, all_loss, config.warmup)
    return metrics


def _resume_from_other_plan(path: str, plan: Plan, dmp: DistributedModelParallel, optimizer: CombinedOptimizer,
                            output: RankOutput) -> tuple[int, dict[str, Any]]:
    """Load the newest checkpoint of a training with another plan into this plan's layout."""
    from rec.train.reshard import load_resharded
    from rec.train.resume import STEP_PREFIX, check_resume, resume_source, table_changes

    source = resume_source(path)
    check_resume(source, plan)
    changes = table_changes(source.plan, plan)
    output.progress(f"resuming plan {plan.plan_id} from plan {source.plan.plan_id}'s checkpoint of "
                    f"iteration {source.step}")
    report = load_resharded(Path(source.checkpoint_dir, f"{STEP_PREFIX}{source.step:08d}"), dmp, optimizer,
                            changes.resized)
    dense = sorted(k.removeprefix("model.") for k in report.initialized
                   if "embedding_bags" not in k and not k.startswith("optim."))
    if changes.reinitialized or dense:
        output.progress(f"re-initialized (shape changed): tables {list(changes.reinitialized)}, dense {dense}")
    return source.step, {
        "from_plan_id": source.plan.plan_id, "step": source.step,
        "tables_restored": len(changes.restored), "tables_resized": len(changes.resized),
        "tables_initialized": len(changes.added) + len(changes.reinitialized),
        "reinitialized": list(changes.reinitialized), "dense_reinitialized": dense,
    }


def _pipeline_step(dmp: DistributedModelParallel, optimizer: CombinedOptimizer, device: torch.device,
                   batches: Iterator[Batch], kind: PipelineKind) -> Callable[[], torch.Tensor]:
    """One training iteration as a function returning its (detached) loss."""
    if kind is PipelineKind.SPARSE_DIST:
        pipeline = TrainPipelineSparseDist(dmp, optimizer, device)
        return lambda: pipeline.progress(batches)[0]  # DLRMTrain's output: (loss, logits, labels)

    def naive() -> torch.Tensor:
        batch = next(batches).to(device, non_blocking=True)
        optimizer.zero_grad()
        loss, _ = dmp(batch)
        loss.backward()
        optimizer.step()
        detached: torch.Tensor = loss.detach()
        return detached

    return naive


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
    except Exception as e:
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
