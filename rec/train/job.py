"""The training job, one process per rank under torchrun: load the plan, never plan, shard the
model with exactly that plan, train, and report iteration latency and loss.

The model is shardflow's own, built from the plan's spec rows (``rec.train.model``: every embedding
module of the spec at its path), or the user's (``--model TARGET``, ``rec.train.user_model``).

    torchrun --nproc-per-node 2 -m rec.train.job --plan out/plan/plan.json --out out/train

Each rank writes its output to OUT/logs/rank-<RANK>.log and, if it fails, the cause to
OUT/logs/rank-<RANK>.error.json; the first rank of each node reports progress on its stdout
(``rec.train.rank_log``). The steps: ``rec.train.rank_process`` (the process), ``model_and_batches``
and ``shard_with_plan`` (here), ``rec.train.start`` (which checkpoint it starts from),
``rec.train.loop`` (the iterations), ``rec.train.metrics`` (what it reports).
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.keyed import CombinedOptimizer, KeyedOptimizerWrapper
from torchrec.optim.optimizers import in_backward_optimizer_filter
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

from rec.analysis.rank_times import predicted_critical_path
from rec.data.columns import Wording
from rec.errors import InputError, Problem
from rec.plan import Plan, read_plan
from rec.plan.torchrec_plan import plan_modules, sharders_for, to_sharding_plan
from rec.settings import add_flags, from_flags
from rec.spec.types import Spec
from rec.torchrec_internals import drop_in_backward_optimizers, optimizer_classes, optimizer_kwargs
from rec.train.agreement import check_agreement, shared_settings
from rec.train.applied import applied_sharding
from rec.train.config import PLAN_ID_FLAG, TrainConfig, resolve_model_kind
from rec.train.evaluate import Evaluator
from rec.train.feed import Feed, reading
from rec.train.float32_adagrad import Float32Adagrad
from rec.train.lifetime import exit_skipping_finalization
from rec.train.loop import Trained, train_iterations
from rec.train.metrics import ITERATIONS_FILE, DataRead, TrainMetrics, latency_stats, loss_stats, write_metrics
from rec.train.model import build_model
from rec.train.model_file import record_model, record_target
from rec.train.ownership import this_run
from rec.train.rank_log import RankOutput
from rec.train.rank_process import check_world_size, process_group, restart_count, run_rank
from rec.train.resume import checkpoint_dir
from rec.train.start import Start, start
from rec.units import counted


def train(plan: Plan, config: TrainConfig, out_dir: str, output: RankOutput,
          plan_path: str | None = None) -> TrainMetrics | None:
    """Train with ``plan`` on this rank; rank 0 writes train_metrics.json and iterations.parquet
    and returns what it wrote (None on the other ranks)."""
    rank, world = dist.get_rank(), dist.get_world_size()
    check_world_size(plan, world)
    device = (torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if plan.topology.compute_device == "cuda"
              else torch.device("cpu"))
    spec = plan.spec
    batch_size = config.batch_size or plan.topology.batch_size
    torch.manual_seed(config.seed)

    output.progress("building the model")
    model, feed = model_and_feed(plan, spec, config, device, world, batch_size)
    evaluator = evaluator_of(config, feed, batch_size, device)
    output.progress(f"sharding {len(plan.tables):,} tables on {counted(world, 'rank')} with the plan")
    dmp, optimizer = shard_with_plan(model, plan, config, device)
    checkpoints = checkpoint_dir(config, out_dir)
    begin = start(plan, config, out_dir, dmp, optimizer, output, plan_path, feed, this_run(out_dir))
    if checkpoints and rank == 0:  # what the checkpoints are of, replacing what an earlier training wrote
        if config.model_target:
            record_target(checkpoints, config.model_target)
        else:
            record_model(checkpoints, spec, config)
    batches = feed.batches(rank, world, device, config.prefetch_batches)
    try:
        done = train_iterations(dmp, optimizer, device, feed, batches, config, begin, checkpoints, out_dir,
                                output, evaluator)
    finally:
        close = getattr(batches, "close", None)
        if close is not None:
            close()
    if done is None:
        return None
    metrics = _metrics(plan, spec, config, world, batch_size, done, begin, dmp, feed)
    write_metrics(out_dir, metrics, done.iterations)
    return metrics


def model_and_feed(plan: Plan, spec: Spec, config: TrainConfig, device: torch.device, world: int,
                   batch_size: int) -> tuple[torch.nn.Module, Feed]:
    """The model to shard (embedding modules on meta) and where a rank's batches come from."""
    if config.model_target:
        from rec.train.user_model import check_user_model

        user = check_user_model(config.model_target, spec)
        return user.model, Feed.of(spec, config, world, batch_size, user)
    return build_model(spec, config, device), Feed.of(spec, config, world, batch_size)


def evaluator_of(config: TrainConfig, feed: Feed, batch_size: int, device: torch.device,
                 what: str = "--eval-data", wording: Wording | None = None) -> Evaluator | None:
    """The evaluation of ``config.eval_data`` (None without it); ``what``: the flag that named the data,
    ``wording``: how its bad values are named (``EVALUATION``'s: --eval-data's)."""
    if not config.eval_data:
        return None
    from rec.data.columns import EVALUATION
    from rec.data.files import open_data
    from rec.data.parquet import ParquetSource

    files = open_data(config.eval_data, what)
    source = ParquetSource.open(files, feed.layout, shuffle=False, window=config.shuffle_window,
                                policy=config.ids, what=what, threads=reading(config).threads,
                                wording=wording or EVALUATION)
    return Evaluator(source, feed.layout, feed.one_module, batch_size, config.eval_batches, device)


_Choice = tuple[type[torch.optim.Optimizer], dict[str, Any]]  # an optimizer class, its keyword arguments


def shard_with_plan(model: torch.nn.Module, plan: Plan, config: TrainConfig, device: torch.device
                    ) -> tuple[DistributedModelParallel, CombinedOptimizer]:
    """``model`` sharded with exactly ``plan``, and its optimizer: fused row-wise Adagrad on the
    planned tables (applied in backward, inside the sharded kernels), Adagrad on the rest (the dense
    layers, and data_parallel tables, as TorchRec trains them): in float32 for parameters of other
    types (``Float32Adagrad``). A user's model keeps the optimizers its code applied in backward
    (``apply_optimizer_in_backward``): a sharded table's in its kernels, a dense parameter's or a
    data_parallel table's stepped after backward with the others (``_chosen_optimizers``)."""
    chosen = _chosen_optimizers(model, plan)
    _fuse_embedding_optimizer(model, plan, config.embedding_lr)
    dmp = DistributedModelParallel(model, device=device, plan=to_sharding_plan(plan), sharders=sharders_for(plan))
    optimizers: list[Any] = [dmp.fused_optimizer]
    dense_params = dict(in_backward_optimizer_filter(dmp.named_parameters()))
    optimizers += _grouped({name: p for name, p in dense_params.items() if name in chosen}, chosen)
    ours = {name: p for name, p in dense_params.items() if name not in chosen}
    full = {name: p for name, p in ours.items() if p.dtype is torch.float32}
    half = {name: p for name, p in ours.items() if p.dtype is not torch.float32}
    if full:
        optimizers.append(KeyedOptimizerWrapper(full, lambda params: torch.optim.Adagrad(params, lr=config.dense_lr)))
    if half:
        optimizers.append(KeyedOptimizerWrapper(half, lambda params: Float32Adagrad(params, lr=config.dense_lr)))
    return dmp, CombinedOptimizer(optimizers)


def _chosen_optimizers(model: torch.nn.Module, plan: Plan) -> dict[str, _Choice]:
    """The optimizer a user's code applied in backward to each parameter, by name; a dense parameter's
    taken off it. A step after backward applies those of the dense parameters and the data_parallel
    tables as backward would have, and checkpoints their state: DMP allocates a parameter on the meta
    device anew without it, and replaces a data_parallel table's (both then trained with Adagrad), and
    DDP ran one on another device in backward (it failed on cpu, and its state was never saved)."""
    import torch.distributed.optim.apply_optimizer_in_backward as in_backward

    planned = tuple(f"{path}." for path in plan_modules(plan))
    chosen = {name: (classes[0], optimizer_kwargs(p)[0]) for name, p in model.named_parameters()
              if len(classes := optimizer_classes(p)) == 1}
    for name in chosen:
        if not name.startswith(planned):  # a table's mark chooses its fused kernels' optimizer: kept
            drop_in_backward_optimizers(model.get_parameter(name), in_backward)
    return chosen


def _grouped(params: dict[str, torch.nn.Parameter], choices: dict[str, _Choice]) -> list[KeyedOptimizerWrapper]:
    """An optimizer for each choice in ``choices`` (by parameter name) over its parameters."""
    groups: list[tuple[_Choice, dict[str, torch.nn.Parameter]]] = []
    for name, p in params.items():
        choice = choices[name]
        group = next((g for c, g in groups if c == choice), None)
        if group is None:
            groups.append((choice, group := {}))
        group[name] = p
    return [KeyedOptimizerWrapper(group, _made(choice)) for choice, group in groups]


def _made(choice: _Choice) -> Callable[[list[torch.nn.Parameter]], torch.optim.Optimizer]:
    return lambda params: choice[0](params, **choice[1])


def _fuse_embedding_optimizer(model: torch.nn.Module, plan: Plan, lr: float) -> None:
    """Fused row-wise Adagrad on every planned embedding module's tables, unless the model's own
    code already chose an optimizer for them."""
    for path in plan_modules(plan):
        params = [p for p in model.get_submodule(path).parameters() if not optimizer_classes(p)]
        if params:
            apply_optimizer_in_backward(RowWiseAdagrad, params, {"lr": lr})


def _metrics(plan: Plan, spec: Spec, config: TrainConfig, world: int, batch_size: int, done: Trained,
             begin: Start, dmp: DistributedModelParallel, feed: Feed) -> TrainMetrics:
    rows = done.iterations
    # A resume at the end (the training stopped before its outputs) adds no row to those it kept.
    none = None
    if not len(rows):
        none = "no iteration to summarize: the rows before the checkpoint were lost (the rank's log says why)"
    elif np.isnan(rows.loss).all():
        none = "no iteration has a loss: an early shardflow wrote those before the checkpoint without one"
    if none:
        raise InputError("Cannot summarize the training:", [Problem(ITERATIONS_FILE, (
            f"{none}, and this training added none; give more --iterations"))])
    stats = latency_stats(rows.measured_ms())
    evaluations = tuple(e.to_dict() for e in done.evaluations)
    return TrainMetrics(
        plan_id=plan.plan_id, world_size=world, iterations=config.iterations,
        warmup=config.warmup, batch_size=batch_size,
        pipeline=config.pipeline.on(world, plan.topology.compute_device).value,
        model=config.model_target or resolve_model_kind(spec, config.model_kind).value, iteration_latency_ms=stats,
        loss=loss_stats(rows.loss), samples_per_s=world * batch_size / (stats.mean / 1e3),
        applied_sharding=applied_sharding(dmp), resumed_from=begin.iteration, resume=begin.resume,
        resumed_run=begin.resumed_run, restarts=restart_count(),
        predicted_critical_path_ms=predicted_critical_path(plan),
        data_wait_ms=latency_stats(rows.measured_ms("data_wait_ms")) if len(rows) else None,
        data=_data_read(config, feed), eval=({k: v for k, v in evaluations[-1].items() if k != "iteration"}
                                             if evaluations else None),
        evaluations=evaluations,
    )


def _data_read(config: TrainConfig, feed: Feed) -> DataRead | None:
    """What the training read (None for a model that brings its own batches)."""
    if feed.source is None:
        return None
    extent = feed.source.extent(feed.position_at(config.iterations))
    return DataRead(extent.source, extent.rows, extent.files, extent.epochs, config.ids.value, extent.shuffled,
                    config.seed, feed.resumed)


def user_code(config: TrainConfig) -> AbstractContextManager[None]:
    """Around the training: a user's model (``--model TARGET``) that exits is that target's failure."""
    if not config.model_target:
        return nullcontext()
    from rec.train.user_model import user_code_exits_fail

    return user_code_exits_fail(config.model_target)


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, TrainConfig]:
    p = argparse.ArgumentParser(prog="rec.train.job", description=__doc__)
    p.add_argument("--plan", required=True)
    p.add_argument("--out", required=True)
    p.add_argument(PLAN_ID_FLAG, help="the plan_id the launcher checked: another plan at --plan is refused")
    add_flags(p, TrainConfig)
    a = p.parse_args(argv)
    return a, from_flags(TrainConfig, a)


def main(argv: list[str] | None = None) -> int:
    args, config = parse_args(argv)

    def work(output: RankOutput) -> None:
        output.progress("loading the plan")
        plan = read_plan(args.plan)
        if args.plan_id and plan.plan_id != args.plan_id:
            raise InputError("The plan changed after the launcher checked it:", [Problem(args.plan, (
                f"holds plan {plan.plan_id}, not plan {args.plan_id}: another command wrote it since (two runs "
                "sharing an --out?); give each run its own --out, or train again"))])
        with process_group(plan.topology.compute_device, config.collective_timeout) as group, user_code(config):
            check_agreement(group, shared_settings(plan, config))
            train(plan, config, args.out, output, args.plan)

    return run_rank("train", args.out, work)


if __name__ == "__main__":
    exit_skipping_finalization(main())
