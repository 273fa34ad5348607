"""The measuring job, one process per rank under torchrun: time a plan's sharded embedding modules
alone, as the cost model rates them, on the ranks the plan is for.

    torchrun --nproc-per-node 2 -m rec.train.measure_job --plan P1.json [P2.json ...] --out OUT

For each plan, in one process group: the spec's embedding modules (no dense layers) sharded by
``DistributedModelParallel`` with exactly the plan's ``ShardingPlan`` and fused row-wise Adagrad;
synthetic ids at the plan's batch size (Poisson with each table's pooling factor, each table's ids
from its hit-rate curve), a pool of batches drawn up front and cycled, sized so that the
fused_uvm_caching tables' caches see a stream rather than rows they hold whole
(``rec.train.synthetic_pool``); warm-up (at least until every cache has filled; on cuda until two
blocks agree: the clocks have settled), then blocks of timed iterations, each block
started together on every rank and run back to back: forward (input distribution, lookup, output
distribution, a loss from the outputs) and backward (gradients back through the output
distribution, lookup backward with the optimizer fused in, data_parallel all-reduce), timed with
``time.perf_counter`` on cpu, CUDA events on cuda (read at the end of a block: no host sync inside
it beyond the work's own). Rank 0 gathers every rank's times and writes
OUT/timings.json (``rec.train.timings``); logs and failures as the training job's
(``rec.train.rank_log``). Many plans share one launch because starting torch and torchrec costs
seconds per process (``shardflow calibrate`` measures dozens).

A plan that cannot be built, sharded or given its batches on some rank (out of memory, a kernel
that refuses it) is recorded as failed, with the lowest such rank's one-line cause, and the job goes
on to the next plan. The ranks agree on that in one collective after building, which every rank
reaches: building runs no collective, except sharding a plan with ``_COLLECTIVE_SHARDING`` tables,
where a failure on several ranks ends the job, as does one while a plan runs there. The other ranks
may be waiting in a collective the failed rank never joins, and mismatched collectives hang or mix up
data. A job of one rank (one GPU) has no other rank to wait: such a plan is failed like any other.
"""

from __future__ import annotations

import argparse
import gc
import itertools
import math
import os
import platform
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import cycle
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.modules.embedding_modules import EmbeddingBagCollection
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rec.data.synthetic import feature_tables
from rec.errors import InputError
from rec.plan import Plan, read_plan
from rec.plan.torchrec_plan import sharders_for, to_sharding_plan
from rec.profile.types import Machine
from rec.settings import add_flags, from_flags
from rec.sharding import ComputeDevice, ModuleKind, ShardingType
from rec.spec import spec_from_rows
from rec.spec.torchrec_modules import embedding_modules, place
from rec.spec.types import Spec, TableSpec
from rec.train.agreement import check_agreement, shared_settings
from rec.train.collectives import Group
from rec.train.lifetime import exit_skipping_finalization
from rec.train.measure_config import AUTO_POOL, LATER_SETTLE_S, SETTLE_BLOCK_MS, SETTLE_TOLERANCE, MeasureConfig
from rec.train.rank_log import RankOutput, one_line
from rec.train.rank_process import check_world_size, process_group, run_rank
from rec.train.synthetic_ids import table_ids
from rec.train.synthetic_pool import MIN_POOL, Pool, synthetic_pool
from rec.train.timings import Phases, PlanTimes, Status, Timings, write_timings


class Embeddings(nn.Module):
    """The spec's embedding modules at their paths, and a forward that feeds each its features and
    sums what comes out into one loss (so backward sends a gradient through every output)."""

    def __init__(self, spec: Spec):
        super().__init__()
        modules = embedding_modules(spec, "meta", trained=True)
        for module in modules.values():
            configs: list[Any] = (module.embedding_bag_configs() if isinstance(module, EmbeddingBagCollection)
                                  else module.embedding_configs())  # type: ignore[operator]
            for config in configs:
                # The sharded kernel initializes its tables itself; TorchRec's second pass over every
                # table (init_fn, uniform again) only costs build time here, where values do not matter.
                config.init_fn = _as_initialized
        place(self, modules)
        # by the spec, not the output's type: a sharded module's output is a LazyAwaitable
        self.unpooled = {path: kind is ModuleKind.EMBEDDING_COLLECTION for path, kind in spec.modules.items()}

    def forward(self, features: dict[str, KeyedJaggedTensor]) -> torch.Tensor:
        sums = []
        for path, unpooled in self.unpooled.items():
            out = self.get_submodule(path)(features[path])
            if unpooled:  # an EmbeddingCollection: a JaggedTensor per feature
                sums += [jt.values().sum() for jt in out.values()]
            else:  # an EmbeddingBagCollection: one KeyedTensor
                sums.append(out.values().sum())
        loss: torch.Tensor = torch.stack(sums).sum()
        return loss


def _as_initialized(weight: torch.Tensor) -> torch.Tensor:
    return weight


def synthetic_features(spec: Spec, batch_size: int, seed: int, distinct: int,
                       device: torch.device) -> Iterator[dict[str, KeyedJaggedTensor]]:
    """Each module's ids for ``distinct`` batches, cycled, drawn on ``device`` as the training job
    draws them (``rec.data.synthetic``: Poisson(pooling factor) ids per sample and feature, each
    table's from its hit-rate curve or the skew model, hot rows scattered; ``rec.train.synthetic_ids``;
    a weighted table's ids each with a weight uniform in (0, 1], float32).
    Every feature's lengths for every batch come first, in one draw each and one host read; then each
    feature's ids, in chunks of at most ``DRAW_CHUNK``, copied straight into the batches: on a GPU,
    pools of millions of ids cost no host time per id, and the draw takes the pool's memory and one
    feature's ids, not twice the pool."""
    generator = torch.Generator(device=device)
    generator.manual_seed(seed)
    made: list[dict[str, KeyedJaggedTensor]] = [{} for _ in range(distinct)]
    for path in spec.modules:
        features = feature_tables(tuple(t for t in spec.tables if t.module == path))
        weighted = any(table.is_weighted for _, table in features)  # every table of a module agrees
        lengths = [torch.poisson(torch.full((distinct, batch_size), float(table.pooling_factor), device=device),
                                 generator=generator).to(torch.int32) for _, table in features]
        per_feature = torch.stack([n.sum(dim=1, dtype=torch.int64) for n in lengths]).cpu()  # (feature, batch)
        ends = per_feature.cumsum(dim=0)
        counts, offsets, totals = per_feature.tolist(), (ends - per_feature).tolist(), ends[-1].tolist()
        values = [torch.empty(n, dtype=torch.int64, device=device) for n in totals]
        weights = [torch.empty(n, dtype=torch.float32, device=device) for n in totals] if weighted else []
        for f, (_, table) in enumerate(features):
            ids = _drawn_ids(sum(counts[f]), table, generator, device)
            drawn_weights = _drawn_weights(sum(counts[f]), generator, device) if weighted else None
            at = 0
            for b in range(distinct):
                n, o = counts[f][b], offsets[f][b]
                values[b][o:o + n].copy_(ids[at:at + n])
                if drawn_weights is not None:
                    weights[b][o:o + n].copy_(drawn_weights[at:at + n])
                at += n
            del ids, drawn_weights
        keys = [f for f, _ in features]
        for b, batch in enumerate(made):
            batch[path] = KeyedJaggedTensor(
                keys=keys, values=values[b], lengths=torch.cat([n[b] for n in lengths]),
                weights=weights[b] if weighted else None,
                stride=batch_size, length_per_key=[c[b] for c in counts]).sync()
        del lengths
    return cycle(made)


DRAW_CHUNK = 1 << 23  # ids drawn at once: bounds the float64 temporaries of the draw


def _drawn_ids(count: int, table: TableSpec, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """``count`` ids of ``table``, in chunks of at most ``DRAW_CHUNK``."""
    chunks = []
    for first in range(0, count, DRAW_CHUNK):
        u = torch.rand(min(DRAW_CHUNK, count - first), generator=generator, device=device, dtype=torch.float64)
        chunks.append(table_ids(u, table.num_embeddings, table.hit_rate_curve))
    return torch.cat(chunks) if chunks else torch.zeros(0, dtype=torch.int64, device=device)


def _drawn_weights(count: int, generator: torch.Generator, device: torch.device) -> torch.Tensor:
    """``count`` weights of a weighted table's ids: uniform in (0, 1], float32 (``rec.data.synthetic``)."""
    u = torch.rand(count, generator=generator, device=device, dtype=torch.float32)
    return u.neg_().add_(1.0)


class Clock:
    """Marks in the order the work runs: ``perf_counter`` on cpu; on cuda CUDA events on the current
    stream, read only at the end of a block (no host sync inside it beyond what the work needs)."""

    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.marks: list[Any] = []

    def mark(self) -> None:
        if self.cuda:
            event = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            event.record()
            self.marks.append(event)
        else:
            self.marks.append(time.perf_counter())

    def spans_ms(self) -> list[float]:
        """The time between consecutive marks, ms; the marks are then cleared."""
        if self.cuda:
            self.marks[-1].synchronize()
            spans = [float(a.elapsed_time(b)) for a, b in itertools.pairwise(self.marks)]
        else:
            spans = [(b - a) * 1e3 for a, b in itertools.pairwise(self.marks)]
        self.marks = []
        return spans


def run_block(dmp: nn.Module, features: Iterator[dict[str, KeyedJaggedTensor]], iterations: int,
              clock: Clock) -> tuple[list[float], list[float]]:
    """``iterations`` iterations back to back: (forward, backward) ms of each, a backward lasting
    until the next iteration starts (the block's end after the last), so that they add up to the block.
    No garbage collection inside a block (as ``timeit``): a collection is the job's, not the plan's."""
    collecting = gc.isenabled()
    gc.disable()
    try:
        for _ in range(iterations):
            batch = next(features)
            clock.mark()
            loss = dmp(batch)
            clock.mark()
            loss.backward()
        clock.mark()
    finally:
        if collecting:
            gc.enable()
    spans = clock.spans_ms()
    return spans[0::2], spans[1::2]


# Sharding types whose sharding itself runs collectives in TorchRec 1.8: data_parallel broadcasts rank
# 0's replica (ShardedEmbeddingBagCollection.reset_parameters), table_row_wise and grid_shard make
# the intra- and cross-node groups on first use (comm.intra_and_cross_node_pg: new_group, barrier).
# DMP's own (init_collective_validation, a process's first DMP) runs before any table is sharded.
_COLLECTIVE_SHARDING = frozenset({ShardingType.DATA_PARALLEL, ShardingType.TABLE_ROW_WISE, ShardingType.GRID_SHARD})


@dataclass
class Built:
    """A plan's sharded modules on this rank (data parallelism not yet set up) and its batches."""

    dmp: DistributedModelParallel
    features: Iterator[dict[str, KeyedJaggedTensor]]
    pool: Pool

    def take(self) -> tuple[DistributedModelParallel, Iterator[dict[str, KeyedJaggedTensor]], Pool]:
        """Its parts, which it then no longer holds: the taker's frame is their one owner, so deleting
        them there frees the plan's memory."""
        parts = self.dmp, self.features, self.pool
        del self.dmp, self.features
        return parts


def build(plan: Plan, config: MeasureConfig, device: torch.device) -> Built | str:
    """``plan``'s sharded modules and synthetic batches on this rank, or why not (``rank R: Type:
    message``; the traceback goes to the rank's log). Runs no collective where the plan's sharding
    runs none; where it does on several ranks, a failure while sharding is raised (no agreement could
    reach the ranks waiting in one; a single rank waits for none). Bad input is raised: it is the same
    on every rank and ends the job."""
    sharding = False
    try:
        spec = spec_from_rows(list(plan.spec_tables))
        model = Embeddings(spec)
        apply_optimizer_in_backward(RowWiseAdagrad, model.parameters(), {"lr": config.embedding_lr})
        sharding_plan, sharders = to_sharding_plan(plan), sharders_for(plan)
        sharding = True
        # DDP (data_parallel tables' gradients) is set up once every rank has built: its set-up is collective.
        dmp = DistributedModelParallel(model, device=device, plan=sharding_plan, sharders=sharders,
                                       init_data_parallel=False)
        sharding = False
        pool = synthetic_pool(plan, config.synthetic_batches)  # the same on every rank: it depends on the plan alone
        features = synthetic_features(spec, plan.topology.batch_size, config.seed + dist.get_rank(), pool.batches,
                                      device)
    except InputError:
        raise
    except Exception as e:
        if sharding and dist.get_world_size() > 1 and any(t.sharding_type in _COLLECTIVE_SHARDING
                                                          for t in plan.tables):
            raise
        traceback.print_exc()
        return f"rank {dist.get_rank()}: {one_line(e)}"
    return Built(dmp, features, pool)


def measure(plan: Plan, plan_path: str, config: MeasureConfig, output: RankOutput, label: str,
            group: Group, settle_s: float) -> PlanTimes:
    """Time ``plan``'s sharded embedding modules on this process group (a collective): the warm-up,
    on cuda further warm-up blocks until the clocks settle (at most ``settle_s``), then
    ``config.blocks`` timed blocks. A plan that could not be built on some rank is failed on every
    rank (``build``); on a single rank, so is one that fails while it runs (out of memory in DDP's
    buckets or an iteration): no other rank waits in a collective it never joins."""
    world = dist.get_world_size()
    check_world_size(plan, world)
    device = group.device
    began = time.monotonic()
    torch.manual_seed(config.seed)
    output.progress(f"{label}sharding {len(plan.tables):,} tables with the plan")
    built = build(plan, config, device)
    error = group.first_text(built if isinstance(built, str) else None)  # the same answer on every rank
    if error is not None:
        del built
        _release(device)
        output.progress(f"{label}failed: {error}")
        return PlanTimes(plan_path, plan.plan_id, Status.FAILED, 0, (), (), phases=Phases(
            setup_s=time.monotonic() - began), error=error)
    assert isinstance(built, Built)
    failed: str | None = None
    try:
        return _run(plan, plan_path, config, output, label, group, settle_s, built, began)
    except InputError:
        raise
    except Exception as e:
        if world > 1:
            raise
        traceback.print_exc()
        failed = f"rank 0: {one_line(e)}"
    _release(device)  # outside the handler, whose traceback's frames held the plan's modules
    output.progress(f"{label}failed: {failed}")
    return PlanTimes(plan_path, plan.plan_id, Status.FAILED, 0, (), (), phases=Phases(
        setup_s=time.monotonic() - began), error=failed)


def _run(plan: Plan, plan_path: str, config: MeasureConfig, output: RankOutput, label: str, group: Group,
         settle_s: float, built: Built, began: float) -> PlanTimes:
    """``measure``'s part after a plan is built: DDP, warm-up, settling and the timed blocks."""
    device = group.device
    dmp, features, pool = built.take()
    dmp.init_data_parallel()
    clock = Clock(device)
    built_at = time.monotonic()

    def over(limit: float) -> bool:  # the same answer on every rank: they stop together
        return group.any(time.monotonic() - began > limit)

    warmup = max(config.warmup, pool.fill_iterations)  # the caches full before anything is timed
    fwd, bwd = run_block(dmp, features, warmup, clock)
    warmed = warmup
    sizes = block_sizes(config, pool.batches)
    if device.type == "cuda" and settle_s > 0 and not over(config.time_limit_s):
        steady = (fwd[1:] or fwd or [1.0], bwd[1:] or bwd or [0.0])  # the first iteration pays one-time costs
        per_iteration = (sum(steady[0]) + sum(steady[1])) / len(steady[0])
        size = _whole_passes(math.ceil(SETTLE_BLOCK_MS / max(per_iteration, 1e-3)), config, pool.batches)
        warmed += _settle(dmp, features, size, clock, group, settle_s)
    settled = time.monotonic()
    fwd, bwd = [], []
    blocks = 0
    for size in sizes:
        if over(config.time_limit_s):  # before the first block: the warm-up alone took too long
            break
        f, b = run_block(dmp, features, size, clock)
        fwd += f
        bwd += b
        blocks += 1
        output.progress(f"{label}block {blocks}/{len(sizes)}", blocks, len(sizes), force=False)
    timed = time.monotonic()
    # The ranks stop together, so each has timed the same iterations: none when the limit came first.
    status = Status.MEASURED if fwd else Status.TIMED_OUT
    times = _gathered(fwd, group), _gathered(bwd, group)
    del dmp, features
    _release(device)
    phases = Phases(setup_s=built_at - began, warmup_s=settled - built_at, warmup_iterations=warmed,
                    timed_s=timed - settled, teardown_s=time.monotonic() - timed)
    return PlanTimes(plan_path, plan.plan_id, status, warmed, *times, blocks=max(blocks, 1), phases=phases,
                     synthetic_batches=pool.batches, touched_over_cache=pool.touched_over_cache,
                     touch_target_reached=pool.reached)


def _release(device: torch.device) -> None:
    """Free what the last plan held before the next one builds (on cuda its cached blocks too: a plan
    that failed for memory may have left them reserved)."""
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def block_sizes(config: MeasureConfig, pool: int | None = None) -> list[int]:
    """The iterations of each timed block on a pool of ``pool`` synthetic batches (default: the
    configured count, ``MIN_POOL`` for auto): ``config.iterations`` shared out over ``config.blocks``
    (fewer blocks where there are too few iterations for a whole pass over the pool in each), each
    rounded up to whole passes, so that every block sees each batch as often. An auto pool larger than
    a block's share is walked instead (``_whole_passes``)."""
    pool = pool or config.synthetic_batches or MIN_POOL
    share = math.ceil(config.iterations / config.blocks)
    if _walked(config, pool, share):
        return [share] * config.blocks
    blocks = max(1, min(config.blocks, config.iterations // pool))
    per_block = _whole_passes(math.ceil(config.iterations / blocks), config, pool)
    return [per_block] * blocks


def _whole_passes(iterations: int, config: MeasureConfig, pool: int) -> int:
    if _walked(config, pool, iterations):
        return iterations
    return math.ceil(iterations / pool) * pool


def _walked(config: MeasureConfig, pool: int, iterations: int) -> bool:
    """Whether ``iterations`` take consecutive batches of the pool rather than whole passes: an auto
    pool grown for the caches, larger than them. Its batches are draws of one distribution, and what
    the caches need is the stream, not each batch as often; rounding would multiply the iterations."""
    return config.synthetic_batches == AUTO_POOL and pool > max(MIN_POOL, iterations)


def _settle(dmp: nn.Module, features: Iterator[dict[str, KeyedJaggedTensor]], size: int, clock: Clock,
            group: Group, limit_s: float) -> int:
    """Warm-up blocks of ``size`` iterations until two in a row agree within ``SETTLE_TOLERANCE`` on
    every rank, or ``limit_s`` has passed; the iterations run."""
    began = time.monotonic()
    previous, ran = math.inf, 0
    while True:
        f, b = run_block(dmp, features, size, clock)
        ran += size
        now = (sum(f) + sum(b)) / size
        settled = abs(now - previous) <= SETTLE_TOLERANCE * min(now, previous)
        previous = now
        if group.any(settled or time.monotonic() - began > limit_s):
            return ran


def _gathered(values: list[float], group: Group) -> tuple[tuple[float, ...], ...]:
    """Every rank's ``values`` (the same count on each: the ranks stop together)."""
    return tuple(tuple(float(v) for v in t.tolist()) for t in group.all_gather(values))


def machine(plan: Plan) -> Machine:
    """This machine, as a profile's ``machine`` block records it."""
    device = plan.topology.compute_device
    if device is ComputeDevice.CUDA:
        name = torch.cuda.get_device_name()
    else:
        name = _cpu_name()
    try:
        import fbgemm_gpu  # type: ignore[import-untyped]

        fbgemm: str | None = str(fbgemm_gpu.__version__)
    except (ImportError, AttributeError):
        fbgemm = None
    world = dist.get_world_size()
    local = int(os.environ.get("LOCAL_WORLD_SIZE", world))
    return Machine(device=device, device_name=name, torch_version=str(torch.__version__), fbgemm_version=fbgemm,
                   world_size=world, local_world_size=local,
                   measured_at=datetime.now(UTC).replace(microsecond=0).isoformat())


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return f"{line.partition(':')[2].strip()} ({os.cpu_count()} cores)"
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def measure_plans(paths: list[str], plans: list[Plan], config: MeasureConfig, output: RankOutput,
                  group: Group, each: Callable[[tuple[PlanTimes, ...]], None] | None = None) -> tuple[PlanTimes, ...]:
    """Each plan measured in turn (``measure``), a failed one among them recorded as failed; ``each``
    is given the measurements so far after every plan."""
    measured: list[PlanTimes] = []
    for k, (path, plan) in enumerate(zip(paths, plans, strict=True)):
        label = f"plan {k + 1}/{len(plans)}: " if len(plans) > 1 else ""
        # The clocks ramp up once, with the first plan that runs; later plans keep the GPU busy but
        # for their short set-up.
        ran = any(m.status is not Status.FAILED for m in measured)
        settle_s = min(config.settle_s, LATER_SETTLE_S) if ran else config.settle_s
        measured.append(measure(plan, path, config, output, label, group, settle_s))
        if each is not None:
            each(tuple(measured))
    return tuple(measured)


PARTIAL_TIMINGS_S = 5.0  # timings.json holds every plan measured more than this long ago


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, MeasureConfig]:
    p = argparse.ArgumentParser(prog="rec.train.measure_job", description=__doc__)
    p.add_argument("--plan", required=True, nargs="+", help="plan.json files, measured in this order")
    p.add_argument("--out", required=True)
    add_flags(p, MeasureConfig)
    a = p.parse_args(argv)
    return a, from_flags(MeasureConfig, a)


def main(argv: list[str] | None = None) -> int:
    args, config = parse_args(argv)

    def work(output: RankOutput) -> None:
        output.progress("loading the plans")
        plans = [read_plan(path) for path in args.plan]
        with process_group(plans[0].topology.compute_device) as group:
            check_agreement(group, shared_settings(plans, config))
            # What exists now lives for the whole job: later collections skip it (a full collection
            # after every plan otherwise walks all of torch's objects: ~0.3 s each).
            gc.freeze()
            where = machine(plans[0])
            last = [time.monotonic()]

            def written(so_far: tuple[PlanTimes, ...]) -> None:
                # Whole, now and then while plans are measured: a job stopped from outside (a budget)
                # leaves what it measured; not after every plan (each write holds all plans so far).
                if dist.get_rank() == 0 and time.monotonic() - last[0] >= PARTIAL_TIMINGS_S:
                    write_timings(args.out, Timings(where, so_far))
                    last[0] = time.monotonic()

            measured = measure_plans(args.plan, plans, config, output, group, written)
            if dist.get_rank() == 0:
                write_timings(args.out, Timings(where, measured))
            group.barrier()

    return run_rank("measure", args.out, work)


if __name__ == "__main__":
    exit_skipping_finalization(main())
