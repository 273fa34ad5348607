"""The measuring job's plans one after another (``rec.train.measure_job.measure_plans``), in this
process and in two forked gloo ranks: a plan that cannot be built on some rank is failed on every
rank with the lowest such rank's cause, and the next plan is still measured; where sharding itself
runs collectives (data_parallel) on several ranks, a failure while sharding ends the job instead of
hanging it (one rank has none to hang: the plan is failed and the next measured). The
plans' INT8 and BF16 tables are measured as the float16 tables they were planned as."""

from __future__ import annotations

import json
import os
import traceback
from pathlib import Path
from typing import cast

import pytest

from rec.planning import plan_spec
from rec.spec import spec_from_rows
from rec.topology import topology_from_dict
from rec.train.measure_config import MeasureConfig
from rec.train.rank_log import RankOutput
from rec.train.timings import Status, Timings, read_timings, write_timings
from tests.forked_ranks import forked_ranks

torch = pytest.importorskip("torch")
pytest.importorskip("torchrec")

from torchrec.distributed.model_parallel import DistributedModelParallel  # noqa: E402

from rec.train import measure_job  # noqa: E402
from rec.train.collectives import Group  # noqa: E402

CONFIG = MeasureConfig(iterations=2, warmup=1, blocks=1, synthetic_batches=2)
OOM = "CUDA out of memory. Tried to allocate 2.00 GiB"


def plan_of(world: int, sharding: str):
    """Two tables, of data types that FBGEMM's training kernels cannot take as they are (measured as float16)."""
    rows = [dict(name="a", num_embeddings=100, embedding_dim=8, sharding_types=[sharding], data_type="INT8"),
            dict(name="b", num_embeddings=60, embedding_dim=8, sharding_types=[sharding], data_type="BF16")]
    topology = topology_from_dict(dict(world_size=world, compute_device="cpu", ddr_cap="1GiB", batch_size=8))
    return plan_spec(spec_from_rows(rows), topology)


class Quiet:
    def progress(self, message: str, *args: object, **kwargs: object) -> None:
        pass


def quiet_output() -> RankOutput:
    """The job's output, without a rank's log file."""
    return cast(RankOutput, Quiet())


def failing_on(rank: int | None, calls: int, monkeypatch) -> None:
    """Sharding runs out of memory on ``rank`` (None: every rank) for its first ``calls`` plans: in DMP's
    constructor, where a real allocation fails (after its own collective of a process's first DMP)."""
    real, seen = DistributedModelParallel._init_dmp, []

    def init_dmp(self, module):
        seen.append(1)
        if rank in (None, torch.distributed.get_rank()) and len(seen) <= calls:
            raise torch.OutOfMemoryError(OOM)
        return real(self, module)

    monkeypatch.setattr(DistributedModelParallel, "_init_dmp", init_dmp)


def test_a_plan_that_fails_to_shard_is_reported_and_the_next_is_measured(single_process_group, monkeypatch,
                                                                         tmp_path):
    plan = plan_of(1, "table_wise")
    failing_on(0, 1, monkeypatch)
    out = measure_job.measure_plans(["p1", "p2"], [plan, plan], CONFIG, quiet_output(), Group.current())
    failed, measured = out
    assert (failed.status, failed.error, failed.iterations) == (Status.FAILED, f"rank 0: OutOfMemoryError: {OOM}", 0)
    assert measured.status is Status.MEASURED and measured.iterations == 2 and measured.error is None
    write_timings(tmp_path, Timings(measure_job.machine(plan), out))
    assert read_timings(tmp_path).plans == out  # what callers read back


def test_one_rank_fails_a_plan_whose_sharding_runs_collectives_and_measures_the_next(single_process_group,
                                                                                      monkeypatch):
    """One GPU is one rank: no other rank waits in the sharding's collectives, so an out-of-memory
    data_parallel plan costs that plan, not the calibration's other probes."""
    plan = plan_of(1, "data_parallel")
    failing_on(0, 1, monkeypatch)
    failed, measured = measure_job.measure_plans(["p1", "p2"], [plan, plan], CONFIG, quiet_output(),
                                                 Group.current())
    assert (failed.status, failed.error) == (Status.FAILED, f"rank 0: OutOfMemoryError: {OOM}")
    assert measured.status is Status.MEASURED and measured.iterations == 2


def test_one_rank_fails_a_plan_that_runs_out_of_memory_after_sharding_and_measures_the_next(
        single_process_group, monkeypatch):
    """DDP's buckets or an iteration may run out of memory after sharding; on one rank nobody waits for
    this one in a collective, so the plan is failed with its cause and the next one measured."""
    real, seen = DistributedModelParallel.init_data_parallel, []

    def init_data_parallel(self):
        seen.append(1)
        if len(seen) == 1:
            raise torch.OutOfMemoryError(OOM)
        return real(self)

    monkeypatch.setattr(DistributedModelParallel, "init_data_parallel", init_data_parallel)
    plan = plan_of(1, "data_parallel")
    failed, measured = measure_job.measure_plans(["p1", "p2"], [plan, plan], CONFIG, quiet_output(),
                                                 Group.current())
    assert (failed.status, failed.error, failed.iterations) == (Status.FAILED, f"rank 0: OutOfMemoryError: {OOM}", 0)
    assert measured.status is Status.MEASURED and measured.iterations == 2


def _rank(rank: int, folder: Path, failing: int | None = 1, sharding: str = "table_wise") -> None:
    """One rank of two, in a forked process: its results, or its traceback, in ``folder/rank-R.json``."""
    try:
        torch.set_num_threads(1)
        torch.distributed.init_process_group("gloo", init_method=f"file://{folder / 'rdzv'}", rank=rank,
                                             world_size=2)
        with pytest.MonkeyPatch.context() as mp:
            failing_on(failing, 1, mp)
            plan = plan_of(2, sharding)
            out = measure_job.measure_plans(["p1", "p2"], [plan, plan], CONFIG, quiet_output(), Group.current())
        result: object = [[t.status.value, t.error, t.iterations] for t in out]
    except BaseException:
        result = traceback.format_exc()
    (folder / f"rank-{rank}.json").write_text(json.dumps(result))
    os._exit(0)


def two_ranks(folder: Path, *args: object) -> list[object]:
    """``_rank``'s results of two forked ranks (None for a rank that wrote none)."""
    return forked_ranks(_rank, folder, *args)


def test_ranks_agree_on_a_failure_only_one_of_them_met(tmp_path):
    """Rank 1 alone runs out of memory sharding the first plan: both ranks record it failed with
    rank 1's cause, and both measure the second plan."""
    got = two_ranks(tmp_path)
    expected = [["failed", f"rank 1: OutOfMemoryError: {OOM}", 0], ["measured", None, 2]]
    assert got == [expected, expected]


def test_a_failure_inside_a_sharding_that_runs_collectives_ends_a_job_of_several_ranks(tmp_path):
    """Sharding a data_parallel plan runs collectives: on two ranks its failure ends each rank's job
    (raised) rather than leave a rank waiting in one the other never joins."""
    got = two_ranks(tmp_path, None, "data_parallel")
    assert all(isinstance(r, str) and "OutOfMemoryError" in r for r in got), got
