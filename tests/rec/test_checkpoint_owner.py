"""``rec.train.ownership``: one run holds a checkpoint directory, a stale holder's lock is taken over,
and each checkpoint's ``run.json`` says which run wrote it (and is checked when read back)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import asdict

import pytest

from rec.errors import InputError
from rec.train.lifetime import join_run_lock
from rec.train.metrics import LatencyStats, LossStats, TrainMetrics, metrics_from_dict
from rec.train.ownership import (
    CHECKPOINT_LOCK_ENV,
    RUN_ENV,
    RUN_FILE,
    Run,
    another_runs,
    holding,
    newest_own,
    parse_run,
    record_writer,
    this_run,
    writer_of,
)
from rec.train.resume import LATEST, step_dir, step_name
from tests.paths import ROOT


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


def reasons(error: InputError) -> str:
    return "\n".join(p.reason for p in error.problems)


def test_a_held_directory_refuses_another_run_naming_the_holder_and_is_free_after(tmp_path):
    directory = tmp_path / "checkpoints"
    first, second = Run.new(tmp_path / "a"), Run.new(tmp_path / "b")
    with holding(directory, first) as env:
        assert parse_run(env[RUN_ENV], RUN_ENV) == first
        with pytest.raises(InputError) as refused, holding(directory, second):
            pass
        assert "in use by another shardflow run" in str(refused.value)
        assert f"run {first.run_id} (--out {first.out_dir}, pid {os.getpid()} " in reasons(refused.value)
    assert not directory.exists()  # made for the run, left with nothing in it: gone again
    with holding(directory, second):
        pass


def test_the_ranks_share_the_lock_and_the_holder_is_named_as_gone_once_its_launcher_died(tmp_path, monkeypatch):
    directory = tmp_path / "checkpoints"
    directory.mkdir()
    with holding(directory, Run.new(tmp_path / "a", pid=dead_pid())) as env:
        monkeypatch.setenv(CHECKPOINT_LOCK_ENV, env[CHECKPOINT_LOCK_ENV])
        rank = join_run_lock(CHECKPOINT_LOCK_ENV)  # a rank of this run: shares the lock
        assert rank is not None
        os.close(rank)
        with pytest.raises(InputError) as refused, holding(directory, Run.new(tmp_path / "b")):
            pass
        assert "that launcher is gone" in reasons(refused.value)


def test_the_lock_of_a_killed_launcher_is_taken_over(tmp_path):
    directory = tmp_path / "checkpoints"
    holder = subprocess.Popen([sys.executable, "-c", (
        "import sys, time\n"
        "from rec.train.ownership import Run, holding\n"
        f"with holding({str(directory)!r}, Run.new({str(tmp_path / 'a')!r})):\n"
        "    print('held', flush=True)\n"
        "    time.sleep(600)\n")], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert holder.stdout is not None and holder.stdout.readline() == "held\n"
    with pytest.raises(InputError):
        with holding(directory, Run.new(tmp_path / "b")):
            pass
    holder.kill()
    holder.wait()
    mine = Run.new(tmp_path / "b")
    with holding(directory, mine):
        assert mine.run_id in (directory / ".shardflow-checkpoints-node0.lock").read_text()


def test_each_checkpoint_names_its_writer_and_only_this_trainings_own_step_is_newest_own(tmp_path):
    directory = tmp_path / "checkpoints"
    a, c = Run.new(tmp_path / "a"), Run.new(tmp_path / "c")
    for step, writer in ((4, a), (8, c)):
        step_dir(directory, step).mkdir(parents=True)
        record_writer(step_dir(directory, step), writer)
    (directory / LATEST).write_text(step_name(8))
    assert writer_of(step_dir(directory, 4)) == a and writer_of(step_dir(directory, 8)) == c
    assert another_runs(step_dir(directory, 8), a) == c
    assert another_runs(step_dir(directory, 8), Run.new(tmp_path / "c")) is None  # a later launch into c
    assert newest_own(directory, tmp_path / "c") == 8 and newest_own(directory, tmp_path / "a") is None
    step_dir(directory, 12).mkdir()  # written before shardflow recorded writers: its reader's own
    (directory / LATEST).write_text(step_name(12))
    assert writer_of(step_dir(directory, 12)) is None and newest_own(directory, tmp_path / "a") == 12


@pytest.mark.parametrize(("edit", "named"), [
    ({"pid": -3}, "pid"),
    ({"out_dir": "/a\x1b[2J"}, "out_dir"),
    ({"shell": "rm -rf /"}, "shell"),
    ({"format": 2}, "format"),
])
def test_an_edited_run_file_is_refused_naming_the_key(tmp_path, edit, named):
    step = tmp_path / step_name(4)
    step.mkdir()
    record_writer(step, Run.new(tmp_path / "a"))
    record = json.loads((step / RUN_FILE).read_text())
    (step / RUN_FILE).write_text(json.dumps({**record, **edit}))
    with pytest.raises(InputError) as refused:
        writer_of(step)
    assert any(p.where == named for p in refused.value.problems)


def test_a_rank_writes_as_the_run_its_launcher_passed(tmp_path, monkeypatch):
    launcher = Run.new(tmp_path / "a")
    monkeypatch.setenv(RUN_ENV, launcher.to_json())
    assert this_run(tmp_path / "a") == launcher
    monkeypatch.delenv(RUN_ENV)
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "rdzv-7")  # a torchrun of the user's own
    assert this_run(tmp_path / "a").run_id == "rdzv-7"


def test_train_metrics_keep_the_run_a_training_resumed_from():
    other = Run.new("/runs/a")
    stats = LatencyStats(1.0, 2.0, 3.0, 1.5)
    metrics = TrainMetrics("p", 2, 9, 1, 32, "naive", "dlrm", stats, LossStats(0.7, 0.5, 0.6), 100.0, {}, 6,
                           resumed_run=other)
    assert metrics_from_dict(json.loads(json.dumps(asdict(metrics))), "m").resumed_run == other
    with pytest.raises(InputError):
        metrics_from_dict({**asdict(metrics), "resumed_run": {**asdict(other), "pid": "x"}}, "m")


def test_pruning_keeps_the_newest_complete_checkpoints_not_counting_a_failed_write(tmp_path):
    from rec.train.checkpoint import prune
    from rec.train.resume import INDEX_FILE

    # step 5 and 8: writes that failed (no index); steps after LATEST's (8, 20) are left as they are
    for step, complete in ((2, True), (4, True), (5, False), (6, True), (8, False), (20, True)):
        (tmp_path / step_name(step)).mkdir()
        if complete:
            (tmp_path / step_name(step) / INDEX_FILE).write_bytes(b"")
    (tmp_path / LATEST).write_text(step_name(6))
    prune(tmp_path, keep=2)
    assert sorted(p.name for p in tmp_path.iterdir() if p.is_dir()) == [step_name(s) for s in (4, 6, 8, 20)]


def test_a_checkpoint_is_judged_by_its_collections_tables_not_by_a_dense_block_named_embeddings():
    """A user's model with a dense `text.embeddings.position` (as HuggingFace's `bert.embeddings`) once had
    its own checkpoint refused on resume as another model's."""
    import torch
    from torch.distributed.checkpoint.metadata import Metadata, TensorProperties, TensorStorageMetadata

    from rec.spec import spec_from_rows
    from rec.train.checkpoint import table_problems

    spec = spec_from_rows([dict(name="user", num_embeddings=100, embedding_dim=8)])

    def index(**shapes):
        return Metadata({fqn: TensorStorageMetadata(TensorProperties(dtype=torch.float32), torch.Size(size), [])
                         for fqn, size in shapes.items()})

    own = {"model.towers.ebc.embedding_bags.user.weight": (100, 8), "model.text.embeddings.position.weight": (4, 8)}
    assert table_problems(index(**own), spec, "step") == []
    other = {"model.towers.ebc.embedding_bags.item.weight": (50, 8)}
    assert [p.reason for p in table_problems(index(**other), spec, "step")] == [
        "holds table 'item', which the model has not: a step of another model's training",
        "holds no weights of table 'user': a step of another model's training"]
    resized = {"model.towers.ebc.embedding_bags.user.weight": (90, 8)}
    assert "is 90 x 8 here, 100 x 8 in the model" in table_problems(index(**resized), spec, "step")[0].reason


def test_node_0_without_the_metrics_of_a_multi_node_training_says_where_they_went(tmp_path):
    """torchrun's c10d rendezvous orders the nodes as they arrive: node 1's ranks may be the ranks from
    0 and write into node 1's --out. Node 0 once said only that its metrics file was missing."""
    from tasks.launch import Launch
    from tasks.train import _node_metrics, file_stamp

    with pytest.raises(InputError, match="its metrics are on another node") as refused:
        _node_metrics(Launch("plan.json", str(tmp_path), 1, nnodes=2), str(tmp_path), written=False)
    assert "give every node the same --out on a shared filesystem" in refused.value.render()
    with pytest.raises(InputError, match="metrics"):  # one node: the file's own reason, as before
        _node_metrics(Launch("plan.json", str(tmp_path), 1), str(tmp_path), written=False)
    # An earlier run's file in node 0's --out was once reported, exit 0, as this run's metrics.
    metrics = tmp_path / "train_metrics.json"
    metrics.write_text("{}")
    before = file_stamp(metrics)
    assert file_stamp(metrics) == before
    with pytest.raises(InputError, match="its metrics are on another node") as refused:
        _node_metrics(Launch("plan.json", str(tmp_path), 1, nnodes=2), str(tmp_path), written=False)
    assert "an earlier run's train_metrics.json" in refused.value.render()
    replaced = tmp_path / ".new"
    replaced.write_text("{}")
    replaced.replace(metrics)  # as a run writes it: whole, renamed over
    assert file_stamp(metrics) != before


def test_nodes_that_never_meet_are_named_as_such_not_as_torchruns_exit_code(tmp_path):
    """A peer that never came: after the join timeout the launch ended with "torchrun exited with code 1
    (see logs/)". A node that did not come back for a restart is named after the failure that began it."""
    from rec.train.rank_log import RankError
    from tasks.launch import LAUNCH_HEADER, Finished, Launch, failure_cause, node_log

    launch = Launch("plan.json", str(tmp_path), 1, nnodes=2, node_rank=0, rdzv_endpoint="127.0.0.1:29400",
                    join_timeout_s=30)
    log = node_log(launch)
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"{LAUNCH_HEADER}\n[E] ... torch.distributed.elastic.rendezvous.api.RendezvousTimeoutError\n")
    cause = failure_cause(launch, Finished(1))
    assert cause.text.startswith("the 2 nodes did not all meet at 127.0.0.1:29400 within 30 s (--join-timeout)")
    lost = RankError(0, "RuntimeError: Connection closed by peer [127.0.0.1]:34492", False, 1.0)
    cause = failure_cause(launch, Finished(1, (lost,)))
    assert cause.text.startswith("rank 0: lost the connection to a rank of another node")
    assert cause.text.endswith("; restarting, the 2 nodes did not meet again at 127.0.0.1:29400 within 30 s "
                               "(--join-timeout)")


def test_a_run_into_a_folder_named_with_unusual_spaces_is_read_back_by_its_ranks(tmp_path, monkeypatch):
    """An --out with an ideographic space (common in Japanese file names) or a no-break space passed every
    check before the launch, then both ranks refused the run their launcher passed them."""
    for name in ("out\u3000dir", "run\u00a0dir", "zero\u200bwidth"):
        launcher = Run.new(tmp_path / name)
        assert parse_run(launcher.to_json(), RUN_ENV) == launcher
    with pytest.raises(InputError):
        parse_run(Run.new(tmp_path / "tab\there").to_json(), RUN_ENV)


def test_a_run_into_a_path_through_a_link_is_the_run_into_the_folder_it_names(tmp_path):
    """``--out lnk/../T`` writes into real/T (the kernel resolves the link before ``..``), but was recorded as
    a T beside lnk: a --resume spelled real/T was refused as another run's checkpoints."""
    (tmp_path / "real" / "sub").mkdir(parents=True)
    (tmp_path / "lnk").symlink_to(tmp_path / "real" / "sub")
    through = Run.new(tmp_path / "lnk" / ".." / "T")
    assert through.out_dir == str(tmp_path / "real" / "T")
    assert through.same_output(Run.new(tmp_path / "real" / "T"))


def test_a_node_whose_ranks_lost_another_nodes_rank_says_so_not_only_gloos_words(tmp_path):
    """A node whose peer node was killed reported its own rank's "Connection reset by peer. This is typically
    caused by a remote worker hanging ... GLHF!", as if the fault were its own."""
    from rec.train.rank_log import RankOutput
    from tasks.launch import Finished, Launch, failure_cause

    gloo = ("Read error [127.0.0.1]:19877: Connection reset by peer. This is typically caused by a remote worker "
            "hanging or bugs in the application. Check the logs of the remote worker before reporting an error. GLHF!")
    RankOutput(str(tmp_path), rank=1, local_rank=0).failed(RuntimeError(gloo))
    two_nodes = Launch("plan.json", str(tmp_path), 1, nnodes=2, node_rank=0, rdzv_endpoint="127.0.0.1:29400")
    assert failure_cause(two_nodes, Finished(1)).text == (
        "rank 1: lost the connection to a rank of another node, which stopped or crashed (see that node's output): "
        "RuntimeError: Read error [127.0.0.1]:19877: Connection reset by peer")
