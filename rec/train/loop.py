"""The training loop: one timed iteration after another, checkpoints (with the data position) and
evaluations on the way, and the iterations of all ranks reduced to one row each (the slowest rank's
latency and wait for data, the ranks' mean loss)."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.distributed.train_pipeline import TrainPipelineSparseDist
from torchrec.optim.keyed import CombinedOptimizer

from rec.errors import InputError, Problem
from rec.evaluation.metrics import Evaluation
from rec.train import checkpoint
from rec.train.collectives import Group
from rec.train.config import FAIL_AT_ENV, PipelineKind, TrainConfig
from rec.train.evaluate import Evaluator
from rec.train.feed import Feed
from rec.train.metrics import Iterations, write_iterations
from rec.train.rank_log import RankOutput
from rec.train.rank_process import restart_count
from rec.train.resume import step_dir
from rec.train.start import Start
from rec.units import counted

if TYPE_CHECKING:
    from torchrec.datasets.utils import Batch

    from rec.train.batch import ModuleBatch


@dataclass(frozen=True)
class Trained:
    """What the loop did (rank 0; the other ranks get None)."""

    iterations: Iterations
    evaluations: tuple[Evaluation, ...]


def train_iterations(dmp: DistributedModelParallel, optimizer: CombinedOptimizer, device: torch.device,
                     feed: Feed, batches: Iterator[Batch | ModuleBatch], config: TrainConfig, start: Start,
                     checkpoints: str | None, out_dir: str, output: RankOutput,
                     evaluator: Evaluator | None = None) -> Trained | None:
    """Train from ``start.iteration`` to ``config.iterations``, a checkpoint every
    ``config.checkpoint_every`` into ``checkpoints``, an evaluation every ``--eval-every`` and at the
    end; every iteration of the training (rank 0; None on the others: a collective, every rank calls it)."""
    rank = dist.get_rank()
    step = pipeline_step(dmp, optimizer, device, batches, config.pipeline.on(dist.get_world_size(), device.type),
                         config.model_target)
    fail_at = _fail_at(rank)
    latencies: list[float] = []
    waits: list[float] = []
    # One buffer on the device, filled without a sync: a list of loss tensors, one per iteration, grew
    # the rank's memory by 40-400 KB an iteration (with the batch) on cpu, the heap never given back.
    losses = torch.zeros(max(config.iterations - start.iteration, 0), dtype=torch.float64, device=device)
    evaluations: list[Evaluation] = list(start.earlier_evaluations)
    every = config.eval_every

    def so_far() -> Iterations | None:
        mine = _reduced(start.iteration, latencies, waits, losses[:len(latencies)], config.warmup)
        if mine is not None:
            _check_finite(mine, config.model_target)
        return start.earlier.then(mine) if mine is not None else None

    def keep_iterations_and_position(done: int) -> Callable[[], None]:
        def keep() -> None:  # with a checkpoint: a resume from it keeps the rows before it, reads on from there
            rows = so_far()  # a collective: every rank
            if rows is not None:
                write_iterations(out_dir, rows, [e.to_dict() for e in evaluations])
                assert checkpoints is not None
                feed.keep_position(step_dir(checkpoints, done), done)
        return keep

    def evaluate(done: int) -> None:
        if evaluator is None:
            return
        # A diverged training says so, not that its outputs cannot be evaluated: one flag from each rank
        # (the whole reduction, as often as --eval-every, would grow with the iterations).
        if Group.current().any(not bool(torch.isfinite(losses[:len(latencies)]).all())):
            so_far()
        output.progress(f"evaluating after iteration {done}")
        result = evaluator.run(step.model(), done)
        if result is not None:
            evaluations.append(result)
            shown = ", ".join(f"{k} {v:.4f}" for k, v in result.values.items() if v is not None)
            output.progress(f"evaluation after iteration {done} on {result.samples:,} samples: {shown}")

    waited = getattr(batches, "waited_s", None)
    output.progress("training", start.iteration, config.iterations)
    for i in range(start.iteration, config.iterations):
        if fail_at is not None and i == fail_at[0]:
            _fail(i, rank, fail_at[1])
        began = time.perf_counter()
        loss = step.run()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        latencies.append((time.perf_counter() - began) * 1e3)
        now_waited = getattr(batches, "waited_s", None)
        waits.append(0.0 if waited is None or now_waited is None else (now_waited - waited) * 1e3)
        waited = now_waited
        losses[i - start.iteration] = loss
        done = i + 1
        if output.due(done, config.iterations):  # the loss's .item() syncs: only when shown
            shown = loss.item()
            if not math.isfinite(shown):  # said now, not at the next checkpoint or the end
                raise _diverged(f"on rank {rank}, first seen at iteration {done}", config.model_target)
            output.progress(f"iteration {done}/{config.iterations}, {latencies[-1]:.1f} ms, "
                            f"loss {shown:.4f}", done, config.iterations)
        if every and done % every == 0 and done < config.iterations:
            evaluate(done)  # before a checkpoint of the same iteration, which keeps it for a resume
        # and at the end: what the training ends with is what export and --resume find, whatever N divides
        every_n = config.checkpoint_every
        if checkpoints and every_n and (done % every_n == 0 or done == config.iterations):
            checkpoint.save(checkpoints, done, dmp, optimizer, keep=config.keep_checkpoints, written_by=start.run,
                            before_latest=keep_iterations_and_position(done))
    if evaluator is not None and (not evaluations or evaluations[-1].iteration != config.iterations):
        evaluate(config.iterations)
    rows = so_far()
    return None if rows is None else Trained(rows, tuple(evaluations))


@dataclass(frozen=True)
class Step:
    """One training iteration (``run``: its detached loss), and the model as evaluation calls it
    (``model``: TorchRec's pipeline, if any, detached; its next ``progress`` attaches it again, the
    batches in flight kept)."""

    run: Callable[[], torch.Tensor]
    model: Callable[[], torch.nn.Module]


def pipeline_step(dmp: DistributedModelParallel, optimizer: CombinedOptimizer, device: torch.device,
                  batches: Iterator[Batch | ModuleBatch], kind: PipelineKind, target: str | None = None) -> Step:
    """One training iteration (``kind`` resolved: ``PipelineKind.on``). The model's forward returns
    ``(losses, output)``, TorchRec's convention (``DLRMTrain``): backward runs on the sum of
    ``losses``, which is the loss reported. ``target``: the user's model's (``--model TARGET``)."""
    loss = torch.zeros(())

    def forward(batch: Batch | ModuleBatch) -> Any:
        nonlocal loss
        output = dmp(batch)
        losses = _losses(output)
        if not losses.requires_grad and torch.is_grad_enabled():  # backward's RuntimeError failed the rank, exit 1
            raise _needs_no_gradient(target)
        loss = losses.detach().sum()
        return output

    if kind is PipelineKind.AUTO:
        raise ValueError("pipeline_step takes the pipeline that runs: resolve auto with PipelineKind.on")
    if kind is PipelineKind.SPARSE_DIST:
        pipeline = TrainPipelineSparseDist(dmp, optimizer, device, custom_model_fwd=forward)

        def pipelined() -> torch.Tensor:
            pipeline.progress(batches)  # returns the forward's output; the loss is kept by forward
            return loss

        return Step(pipelined, pipeline.detach)

    def naive() -> torch.Tensor:
        batch = next(batches).to(device, non_blocking=True)
        optimizer.zero_grad()
        losses, _ = forward(batch)
        torch.autograd.backward(torch.sum(losses, dim=0))
        optimizer.step()
        return loss

    return Step(naive, lambda: dmp)


def _losses(output: Any) -> torch.Tensor:
    """The ``losses`` of a forward's ``(losses, output)``; InputError for anything else."""
    losses = output[0] if isinstance(output, (tuple, list)) and len(output) == 2 else None
    if not isinstance(losses, torch.Tensor) or losses.dim() > 1:
        raise InputError("The model's forward does not return (loss, output):", [Problem(
            "forward(batch)", f"returned {_returned(output)}{_shape(losses)}; return (loss, output), as "
                              "TorchRec's DLRMTrain and train pipelines do")])
    return losses


def _needs_no_gradient(target: str | None) -> InputError:
    return InputError(f"The training with {target or 'the model'} cannot learn:", [Problem(
        target or "the model", "its forward returned a loss that needs no gradient (requires_grad False: "
                               "detached, or computed under torch.no_grad()); return one computed from its "
                               "parameters")])


def _returned(output: Any) -> str:
    """What a forward returned, in a few words: a tuple of three is not the pair it must be."""
    if isinstance(output, (tuple, list)):
        return f"a {type(output).__name__} of {counted(len(output), 'item')}"
    return type(output).__name__


def _shape(value: Any) -> str:
    return f" with a loss of shape {tuple(value.shape)}" if isinstance(value, torch.Tensor) else ""


def _reduced(start: int, latencies: list[float], waits: list[float], losses: torch.Tensor,
             warmup: int) -> Iterations | None:
    """This run's iterations over all ranks (a collective): an iteration takes as long as its
    slowest rank, waits for data as long as the rank that waited longest, its loss is the mean over
    the ranks. Rank 0 gets them, the others None."""
    group = Group.current()
    slowest = group.max(latencies + waits)
    total = group.sum(losses.clone())  # reduced in place: not the loop's own buffer
    if dist.get_rank() != 0:
        return None
    n = len(latencies)
    return Iterations.of_run(start, slowest[:n].numpy(), total.numpy() / dist.get_world_size(), warmup,
                             slowest[n:].numpy())


def _check_finite(rows: Iterations, target: str | None = None) -> None:
    """InputError where the loss is not finite (rank 0, before a checkpoint of such weights is named
    by LATEST and before the metrics are written): the training diverged, and would again."""
    bad = ~np.isfinite(rows.loss)
    if bad.any():
        first = int(rows.iteration[bad][0]) + 1  # counted from 1, as progress and the checkpoints count
        raise _diverged(f"at {int(bad.sum()):,} of {len(bad):,} iterations, first at iteration {first}", target)


def _diverged(where: str, target: str | None) -> InputError:
    causes = (f"{target}'s model or batches (parameters or buffers it leaves on the meta device: the "
              "launcher's notes), or learning rates too high" if target else
              "dense values too large for the model, or learning rates too high")
    return InputError("The training diverged:", [Problem("loss", (
        f"not finite (NaN or infinite) {where}: {causes} (--dense-lr, --embedding-lr)"))])


def _fail_at(rank: int) -> tuple[int, str] | None:
    """Fault injection (tests): ``ITER:RANK`` kills the rank at that iteration, ``ITER:RANK:raise``
    raises there instead."""
    spec = os.environ.get(FAIL_AT_ENV)
    if not spec or restart_count() > 0:
        return None
    iteration, _, rest = spec.partition(":")
    fail_rank, _, how = rest.partition(":")
    return (int(iteration), how) if int(fail_rank or 0) == rank else None


def _fail(iteration: int, rank: int, how: str) -> None:
    if how == "raise":
        raise RuntimeError(f"injected failure at iteration {iteration} on rank {rank}")
    os._exit(17)  # a crashed rank, for the restart test

