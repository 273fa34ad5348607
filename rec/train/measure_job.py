"""The measuring job, one process per rank under torchrun: time a plan's sharded embedding modules
alone, as the cost model rates them, on the ranks the plan is for.

    torchrun --nproc-per-node 2 -m rec.train.measure_job --plan P1.json [P2.json ...] --out OUT

For each plan, in one process group: the spec's embedding modules (no dense layers) sharded by
``DistributedModelParallel`` with exactly the plan's ``ShardingPlan`` and fused row-wise Adagrad;
synthetic ids at the plan's batch size (Poisson with each table's pooling factor); warm-up, then
timed iterations, each started together on every rank: forward (input distribution, lookup, output
distribution, a loss from the outputs) and backward (gradients back through the output
distribution, lookup backward with the optimizer fused in, data_parallel all-reduce), timed with
``time.perf_counter`` on cpu, CUDA events on cuda. Rank 0 gathers every rank's times and writes
OUT/timings.json (``rec.train.timings``); logs and failures as the training job's
(``rec.train.rank_log``). Many plans share one launch because starting torch and torchrec costs
seconds per process (``shardflow calibrate`` measures dozens).
"""

from __future__ import annotations

import argparse
import gc
import os
import platform
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from itertools import cycle
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torchrec.distributed.model_parallel import DistributedModelParallel
from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
from torchrec.optim.rowwise_adagrad import RowWiseAdagrad
from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

from rec.plan import Plan, read_plan
from rec.plan.torchrec_plan import sharders_for, to_sharding_plan
from rec.profile.types import Machine
from rec.settings import add_flags, from_flags
from rec.sharding import ComputeDevice, ModuleKind
from rec.spec import spec_from_rows
from rec.spec.torchrec_modules import embedding_modules, place
from rec.spec.types import Spec
from rec.train.data import synthetic_batch
from rec.train.measure_config import MeasureConfig
from rec.train.rank_log import RankOutput
from rec.train.rank_process import check_world_size, exit_skipping_finalization, process_group, run_rank
from rec.train.timings import PlanTimes, Status, Timings, write_timings


class Embeddings(nn.Module):
    """The spec's embedding modules at their paths, and a forward that feeds each its features and
    sums what comes out into one loss (so backward sends a gradient through every output)."""

    def __init__(self, spec: Spec):
        super().__init__()
        place(self, embedding_modules(spec, "meta"))
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


def synthetic_features(spec: Spec, batch_size: int, seed: int, distinct: int,
                       device: torch.device) -> Iterator[dict[str, KeyedJaggedTensor]]:
    """Each module's ids for ``distinct`` batches, cycled; drawn as the training job draws them."""
    rng = np.random.default_rng(seed)
    made = []
    for _ in range(distinct):
        batch = {}
        for path in spec.modules:
            tables = tuple(t for t in spec.tables if t.module == path)
            kjt = synthetic_batch(Spec(tables, spec.spec_hash), batch_size, 1, rng).sparse_features
            batch[path] = kjt.to(device)
        made.append(batch)
    return cycle(made)


class Clock:
    """Forward and backward times of the iterations: perf_counter on cpu; on cuda CUDA events,
    read once at the end (no sync inside an iteration beyond what the work itself needs)."""

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

    def times_ms(self) -> tuple[list[float], list[float]]:
        """(forward, backward) per iteration, from three marks per iteration."""
        if self.cuda:
            torch.cuda.synchronize()
            spans = [self.marks[i].elapsed_time(self.marks[i + 1]) for i in range(len(self.marks) - 1)]
        else:
            spans = [(self.marks[i + 1] - self.marks[i]) * 1e3 for i in range(len(self.marks) - 1)]
        return spans[0::3], spans[1::3]


def measure(plan: Plan, plan_path: str, config: MeasureConfig, output: RankOutput, label: str) -> PlanTimes:
    """Time ``plan``'s sharded embedding modules on this process group (a collective)."""
    world = dist.get_world_size()
    check_world_size(plan, world)
    cuda = plan.topology["compute_device"] == "cuda"
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)  # the events time this rank's GPU, NCCL's collectives run on it
    spec = spec_from_rows(list(plan.spec_tables))
    batch_size = int(plan.topology["batch_size"])
    torch.manual_seed(config.seed)
    output.progress(f"{label}sharding {len(plan.tables):,} tables with the plan")
    model = Embeddings(spec)
    apply_optimizer_in_backward(RowWiseAdagrad, model.parameters(), {"lr": config.embedding_lr})
    dmp = DistributedModelParallel(model, device=device, plan=to_sharding_plan(plan), sharders=sharders_for(plan))
    features = synthetic_features(spec, batch_size, config.seed + dist.get_rank(), config.synthetic_batches, device)
    stop = torch.zeros(1, device=device)
    clock = Clock(device)
    began = time.monotonic()
    total = config.warmup + config.iterations
    for i in range(total):
        dist.all_reduce(stop, op=dist.ReduceOp.MAX)  # starts the iteration together on every rank
        if stop.item() > 0:
            break
        if cuda:
            torch.cuda.synchronize(device)
        timed = i >= config.warmup
        batch = next(features)
        if timed:
            clock.mark()
        loss = dmp(batch)
        if timed:
            clock.mark()
        loss.backward()
        if timed:
            clock.mark()
            if cuda:
                torch.cuda.synchronize(device)
        stop.fill_(1.0 if time.monotonic() - began > config.time_limit_s else 0.0)
        output.progress(f"{label}iteration {i + 1}/{total}", i + 1, total, force=False)
    fwd, bwd = clock.times_ms()
    # The ranks stop together, so each has timed the same iterations: none when the limit came first.
    status = Status.MEASURED if fwd else Status.TIMED_OUT
    times = _gathered(fwd, device), _gathered(bwd, device)
    del dmp, model, features
    gc.collect()
    return PlanTimes(plan_path, plan.plan_id, status, config.warmup, *times)


def _gathered(values: list[float], device: torch.device) -> tuple[tuple[float, ...], ...]:
    """Every rank's ``values`` (the same count on each: the ranks stop together)."""
    mine = torch.tensor(values, dtype=torch.float64, device=device)
    every = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(every, mine)
    return tuple(tuple(float(v) for v in t.cpu().tolist()) for t in every)


def machine(plan: Plan) -> Machine:
    """This machine, as a profile's ``machine`` block records it."""
    device = ComputeDevice(plan.topology["compute_device"])
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
        with process_group(plans[0].topology["compute_device"]):
            measured = []
            for k, (path, plan) in enumerate(zip(args.plan, plans, strict=True)):
                label = f"plan {k + 1}/{len(plans)}: " if len(plans) > 1 else ""
                measured.append(measure(plan, path, config, output, label))
            if dist.get_rank() == 0:
                write_timings(args.out, Timings(machine(plans[0]), tuple(measured)))
            dist.barrier()

    return run_rank("measure", args.out, work)


if __name__ == "__main__":
    exit_skipping_finalization(main())
