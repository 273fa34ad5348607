"""The life of one rank process under torchrun, whatever it runs (the training job, the measuring
job): start only where it may, never plan, join the process group, turn a failure into its exit
code and a cause for the launcher, and leave without the race of interpreter finalization.
"""

from __future__ import annotations

import datetime
import os
import sys
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from typing import NoReturn

# Imported with the job, in the forkserver the ranks are forked from, not in every rank: torchrec's
# apply_optimizer_in_backward imports torch.distributed.optim on its first call, which
# TorchScript-compiles its functional optimizers (0.4-0.7 CPU-s a rank); read_plan's shard check
# imports pyarrow.compute; pyarrow imports pandas (where installed; below) on its first array, which
# a rank makes to write iterations.parquet or read Parquet (0.2-0.4 CPU-s).
import pyarrow.compute  # noqa: F401
import torch.distributed as dist
import torch.distributed.optim  # noqa: F401
from torchrec.distributed.planner import EmbeddingShardingPlanner

from rec.errors import InputError, Problem
from rec.exit_codes import ExitCode
from rec.plan import Plan
from rec.sharding import ComputeDevice
from rec.train.collectives import Group, join
from rec.train.lifetime import RunLockTaken, die_with_torchrun, join_run_lock
from rec.train.ownership import CHECKPOINT_LOCK_ENV
from rec.train.rank_log import RankOutput

with suppress(ImportError):  # pyarrow works without pandas (a GPU image may not ship it)
    import pandas  # type: ignore[import-untyped]  # noqa: F401

RESTART_COUNT_ENV = "TORCHELASTIC_RESTART_COUNT"  # torchrun's: 0 on the first attempt


def restart_count() -> int:
    """How often torchrun restarted the ranks of this run (0: the first attempt)."""
    return int(os.environ.get(RESTART_COUNT_ENV, "0"))


def run_rank(command: str, out_dir: str, work: Callable[[RankOutput], None]) -> ExitCode:
    """Run ``work`` as this rank's whole job: not at all when torchrun is gone or another run holds
    ``out_dir`` or the checkpoint directory; with TorchRec's planner refused. Bad input exits
    ``BAD_INPUT``, any other failure ``FAILED``; either leaves its cause in the rank's error file
    for the launcher."""
    if not die_with_torchrun():
        print(f"shardflow {command}: torchrun, this rank's parent, is gone; not starting", file=sys.stderr)
        return ExitCode.FAILED
    try:
        join_run_lock()  # held until this process ends
        join_run_lock(CHECKPOINT_LOCK_ENV)
    except RunLockTaken as e:
        print(f"shardflow {command}: {e}; not starting", file=sys.stderr)
        return ExitCode.FAILED
    output = RankOutput(out_dir, int(os.environ.get("RANK", 0)), int(os.environ.get("LOCAL_RANK", 0)),
                        str(restart_count()))
    EmbeddingShardingPlanner.plan = _refuse_to_plan
    EmbeddingShardingPlanner.collective_plan = _refuse_to_plan
    try:
        work(output)
    except InputError as e:
        output.failed(e)
        print(f"shardflow {command}: {e.render()}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except KeyboardInterrupt:
        raise
    except BaseException as e:  # DCP's CheckpointException, an exit (SystemExit): never a finished rank
        output.failed(e)
        traceback.print_exc()
        return ExitCode.FAILED
    return ExitCode.OK


def _refuse_to_plan(*_args: object, **_kwargs: object) -> NoReturn:
    raise RuntimeError("shardflow's training job never plans: it was given a plan artifact")


def check_world_size(plan: Plan, world_size: int) -> None:
    """InputError unless the job has as many processes as ``plan`` has ranks."""
    planned = plan.world_size
    if planned != world_size:
        raise InputError("The plan does not match this job:", [
            Problem(f"plan {plan.plan_id}",
                    f"was made for world_size {planned}, the job has {world_size} processes; "
                    "replan or change --nnodes/--nproc-per-node")])


@contextmanager
def process_group(device: ComputeDevice | str, timeout_s: float | None = None) -> Iterator[Group]:
    """The default process group for ``device``'s ranks (NCCL on cuda, gloo on cpu) for the block; its
    collectives wait ``timeout_s`` for the others (None: ``collectives.COLLECTIVE_TIMEOUT``)."""
    group = init_process_group(device, timeout_s)
    try:
        yield group
    finally:
        dist.destroy_process_group()


def init_process_group(device: ComputeDevice | str, timeout_s: float | None = None) -> Group:
    """The default process group on a store prefixed by torchrun's restart count.

    After a rank dies and torchrun restarts the workers, env:// can hand the new workers the dead
    workers' gloo addresses (stale keys in the reused store) and the restart fails to connect; a
    prefix per attempt gives every restart fresh keys."""
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    agent_hosts_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                          is_master=not agent_hosts_store and rank == 0, multi_tenant=True)
    return join(device, dist.PrefixStore(f"shardflow/attempt_{restart_count()}", store), rank, world,
                None if timeout_s is None else datetime.timedelta(seconds=timeout_s))
