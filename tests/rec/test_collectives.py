"""The NCCL rule: a collective's tensors live on the process group's device. CI has no GPU to catch a
CPU tensor in an NCCL all-reduce ("No backend type associated with device type cpu", the end of
every cuda training before), so every collective of shardflow's own code goes through
``rec.train.collectives.Group``, which puts them there, and this test keeps raw
``torch.distributed`` collectives out of every other module."""

from __future__ import annotations

import ast

from tests.paths import ROOT

COLLECTIVES = {
    "all_reduce", "all_gather", "all_gather_into_tensor", "all_gather_object", "all_to_all", "all_to_all_single",
    "barrier", "monitored_barrier", "broadcast", "broadcast_object_list", "gather", "gather_object", "reduce",
    "reduce_scatter", "reduce_scatter_tensor", "scatter", "scatter_object_list", "send", "recv", "isend", "irecv",
}
HOME = ROOT / "rec" / "train" / "collectives.py"
CHECKED = ("rec", "tasks", "flows", "bench")

# The training loop's reduction before this rule: CPU tensors handed to whatever backend the group has.
OLD_REDUCED = '''
import torch
import torch.distributed as dist

def _reduced(start, latencies, losses, warmup):
    local = torch.tensor(latencies, dtype=torch.float64)
    dist.all_reduce(local, op=dist.ReduceOp.MAX)
    total = torch.stack(losses).to(torch.float64) if losses else torch.zeros(0, dtype=torch.float64)
    dist.all_reduce(total, op=dist.ReduceOp.SUM)
'''


def raw_collectives(source: str) -> list[str]:
    """``name(line)`` of every call of a torch.distributed collective in ``source``, through any alias."""
    tree = ast.parse(source)
    aliases = {"torch.distributed"}
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            aliases |= {a.asname for a in node.names if a.name == "torch.distributed" and a.asname}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch.distributed":
            names |= {a.asname or a.name for a in node.names if a.name in COLLECTIVES}
        elif isinstance(node, ast.ImportFrom) and node.module == "torch":
            aliases |= {a.asname or a.name for a in node.names if a.name == "distributed"}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr in COLLECTIVES and ast.unparse(f.value) in aliases:
            found.append(f"{f.attr}({node.lineno})")
        elif isinstance(f, ast.Name) and f.id in names:
            found.append(f"{f.id}({node.lineno})")
    return found


def test_the_guard_catches_the_old_training_loop_reduction():
    assert raw_collectives(OLD_REDUCED) == ["all_reduce(7)", "all_reduce(9)"]
    assert raw_collectives("from torch.distributed import barrier as b\nb()\n") == ["b(2)"]
    assert raw_collectives("import torch\ntorch.distributed.all_gather(x, y)\n") == ["all_gather(2)"]


def test_no_module_but_collectives_calls_a_torch_distributed_collective():
    offenders = {}
    for folder in CHECKED:
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == HOME:
                continue
            found = raw_collectives(path.read_text())
            if found:
                offenders[str(path.relative_to(ROOT))] = found
    assert not offenders, f"use rec.train.collectives.Group (tensors on the group's device): {offenders}"


def test_group_reduces_gathers_and_waits_on_the_cpu_group(single_process_group):
    import torch

    from rec.train.collectives import Group

    group = Group.current()
    assert group.device == torch.device("cpu")
    assert group.max([1.0, 5.0]).tolist() == [1.0, 5.0]
    assert group.sum(torch.tensor([0.5, 0.25])).tolist() == [0.5, 0.25]
    assert [t.tolist() for t in group.all_gather([3.0])] == [[3.0]]
    assert group.any(True) and not group.any(False)
    group.barrier()


def _gathering_rank(rank, folder):
    """One of two forked ranks: gathers rows of a different length on each, three columns a round."""
    import json
    import os
    import traceback

    import torch
    import torch.distributed as dist

    try:
        from rec.train.collectives import Group

        torch.set_num_threads(1)
        dist.init_process_group("gloo", init_method=f"file://{folder / 'rdzv'}", rank=rank, world_size=2)
        rows = torch.arange(2 * (7 + 3 * rank), dtype=torch.float64).view(2, -1) + 100 * rank
        every = Group.current().gather_rows(rows, chunk=3)
        result = None if every is None else [t.tolist() for t in every]
    except BaseException:
        result = traceback.format_exc()
    (folder / f"rank-{rank}.json").write_text(json.dumps(result))
    os._exit(0)


def test_rank_zero_gathers_every_ranks_rows_whole_and_in_order_a_chunk_at_a_time(tmp_path):
    """What evaluation sends rank 0: each rank's (logits, labels) of its own length, in rank order,
    in chunks smaller than either rank's share; the other rank holds nothing of them."""
    from tests.forked_ranks import forked_ranks

    got = forked_ranks(_gathering_rank, tmp_path)
    expected = [[list(range(0, 7)), list(range(7, 14))], [list(range(100, 110)), list(range(110, 120))]]
    assert got == [expected, None]


def _waiting_rank(rank, folder, timeout_s):
    """One of two forked ranks: rank 1 joins, then freezes (sleeps) where rank 0 reduces."""
    import datetime
    import json
    import os
    import time

    import torch
    import torch.distributed as dist

    from rec.train import collectives

    torch.set_num_threads(1)
    group = collectives.join("cpu", dist.FileStore(str(folder / "store"), 2), rank, 2,  # --collective-timeout's
                             datetime.timedelta(seconds=timeout_s))
    began = time.monotonic()
    if rank == 1:
        time.sleep(5 * timeout_s)  # frozen, well past the timeout, then gone
        os._exit(0)
    try:
        group.max([1.0])
        result = "reduced"
    except RuntimeError as e:
        result = f"failed after {time.monotonic() - began:.0f} s: {str(e)[:60]}"
    (folder / f"rank-{rank}.json").write_text(json.dumps(result))
    os._exit(0)


def test_a_rank_waiting_for_a_frozen_peer_fails_after_the_collective_timeout_not_gloos_30_minutes(tmp_path):
    """A node stopped by SIGSTOP held every other node for gloo's default 30 minutes, progress frozen."""
    import datetime

    from rec.train.collectives import COLLECTIVE_TIMEOUT
    from rec.train.config import TrainConfig
    from tests.forked_ranks import forked_ranks

    assert COLLECTIVE_TIMEOUT == datetime.timedelta(minutes=10)  # NCCL's default, for gloo too
    assert datetime.timedelta(seconds=TrainConfig().collective_timeout) == COLLECTIVE_TIMEOUT  # --collective-timeout's
    waited, _ = forked_ranks(_waiting_rank, tmp_path, 2, timeout_s=30)
    assert waited.startswith("failed after ") and int(waited.split()[2]) < 8, waited  # not when rank 1 left
