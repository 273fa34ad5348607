"""Training resumes across a schema change: a checkpoint of plan A seeds a training with plan B
(another world size, a table added, one grown, one removed). Checked value by value against the
checkpoints themselves."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from rec.train.resume import step_dir
from tests.flows.checkpoint_state import full_state
from tests.flows.cli_in_process import shardflow_here
from tests.flows.going_on import write_next

pytestmark = pytest.mark.slow  # real torchrun trainings

EBC = "model.sparse_arch.embedding_bag_collection.embedding_bags"
TABLES_A = """tables:
- {name: users, num_embeddings: 2000, embedding_dim: 16}
- {name: item_ids, num_embeddings: 1000, embedding_dim: 16}
- {name: wide, num_embeddings: 500, embedding_dim: 256}
- {name: gone, num_embeddings: 300, embedding_dim: 16}
"""
TABLES_B = """tables:
- {name: users, num_embeddings: 4000, embedding_dim: 16}
- {name: item_ids, num_embeddings: 1000, embedding_dim: 16}
- {name: wide, num_embeddings: 500, embedding_dim: 256}
- {name: fresh, num_embeddings: 100, embedding_dim: 16}
"""


def topology(path: Path, world: int) -> Path:
    path.write_text(f"world_size: {world}\nlocal_world_size: {world}\ncompute_device: cpu\n"
                    "ddr_cap: 4GiB\nbatch_size: 32\n")
    return path


def shardflow(*args: str) -> None:
    """``shardflow ARGS``, in this process, succeeding."""
    from flows.cli import main

    assert main(list(args)) == 0


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("resume")
    (tmp / "a.yaml").write_text(TABLES_A)
    (tmp / "b.yaml").write_text(TABLES_B)
    shardflow("plan", "--no-track", str(tmp / "a.yaml"), "--topology", str(topology(tmp / "t2.yaml", 2)), "--out",
              str(tmp / "plan_a"), "--no-chart")
    shardflow("plan", "--no-track", str(tmp / "b.yaml"), "--topology", str(topology(tmp / "t3.yaml", 3)), "--out",
              str(tmp / "plan_b"), "--no-chart")
    shardflow("train", "--plan", str(tmp / "plan_a"), "--out", str(tmp / "train_a"), "--iterations", "4",
              "--warmup", "1", "--checkpoint-every", "4", "--no-track")
    return tmp


def test_a_new_plan_on_another_world_size_resumes_from_the_old_checkpoint(trained, capfd):
    tmp = trained
    r = shardflow_here(capfd, "train", "--plan", str(tmp / "plan_b"), "--out", str(tmp / "train_b"),
                       "--iterations", "6", "--warmup", "1", "--checkpoint-every", "100",
                       "--resume-from", str(tmp / "train_a"), "--no-track")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    metrics = json.loads((tmp / "train_b" / "train_metrics.json").read_text())
    plan_a = json.loads((tmp / "plan_a" / "plan.json").read_text())
    assert metrics["world_size"] == 3 and metrics["resumed_from"] == 4 and metrics["iterations"] == 6
    assert metrics["resume"] == {"from_plan_id": plan_a["plan_id"], "step": 4, "tables_restored": 2,
                                 "tables_resized": 1, "tables_initialized": 1, "reinitialized": [],
                                 "dense_reinitialized": metrics["resume"]["dense_reinitialized"]}
    assert "Traceback" not in r.stderr
    # The summary says it, not only train_metrics.json: from which plan and step, and what it restored.
    (resumed,) = [line for line in r.stdout.splitlines() if line.startswith("resumed")]
    assert resumed.startswith(f"resumed   from plan {plan_a['plan_id']} at step 4 ({tmp / 'train_a'}): "
                              "2 tables restored, 1 resized, 1 initialized")
    # Beside it the plan's predicted iteration time, printed as `plan` and `measure` print it.
    from rec.analysis.iteration_time import prediction
    from rec.plan import read_plan

    predicted = prediction(read_plan(tmp / "plan_b"))
    assert f"predicted {predicted.text()}; measured {metrics['iteration_latency_ms']['p50']:.4f} ms (p50): " \
           f"{metrics['iteration_latency_ms']['p50'] / predicted.iteration_ms:.3f}x predicted" in r.stdout
    # Planned under TorchRec's defaults: the next line says why the ratio is far off and what measures them.
    after = r.stdout.split("x predicted", 1)[1].splitlines()[1]
    assert after.startswith("note      the prediction uses TorchRec's default constants, not this machine's")
    assert "shardflow calibrate" in after

    old = full_state(step_dir(tmp / "train_a" / "checkpoints", 4), tmp)
    new = full_state(step_dir(tmp / "train_b" / "checkpoints", 4), tmp)  # B's layout, before training on
    for table in ("item_ids", "wide"):
        for key in (f"model.{EBC}.{table}.weight", f"optim.state.{EBC}.{table}.weight.{table}.momentum1"):
            assert torch.equal(old[key], new[key]), key
    grown = f"model.{EBC}.users.weight"
    assert new[grown].shape == (4000, 16) and torch.equal(new[grown][:2000], old[grown])
    momentum = f"optim.state.{EBC}.users.weight.users.momentum1"
    assert torch.equal(new[momentum][:2000], old[momentum]) and old[momentum].abs().sum() > 0
    assert f"model.{EBC}.fresh.weight" in new and f"model.{EBC}.gone.weight" not in new


def test_a_checkpoint_that_is_not_there_or_of_the_wrong_plan_is_refused_before_launch(trained, tmp_path, capfd):
    tmp = trained
    r = shardflow_here(capfd, "train", "--plan", str(tmp / "plan_b"), "--out", str(tmp_path / "x"), "--iterations",
                       "6", "--warmup", "1", "--resume-from", str(tmp_path / "nowhere"), "--no-track")
    assert r.returncode == 2 and "no such directory" in r.stderr and "Traceback" not in r.stderr
    r = shardflow_here(capfd, "train", "--plan", str(tmp / "plan_b"), "--out", str(tmp_path / "y"), "--iterations",
                       "3", "--warmup", "1", "--resume-from", str(tmp / "train_a"), "--no-track")
    assert r.returncode == 2 and "not above the checkpoint's iteration 4" in r.stderr


class _Payload:
    """Unpickling this runs a command: what a crafted checkpoint index would do."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (subprocess.call, (["touch", str(self.marker)],))


def test_a_checkpoint_whose_index_would_run_code_is_refused_unopened(trained, tmp_path, capfd):
    import pickle
    import shutil

    crafted = tmp_path / "crafted"
    shutil.copytree(trained / "train_a" / "checkpoints", crafted)
    marker = tmp_path / "pwned"
    step = next(crafted.glob("step_*"))
    (step / ".metadata").write_bytes(pickle.dumps(_Payload(marker)))
    r = shardflow_here(capfd, "train", "--plan", str(trained / "plan_b"), "--out", str(tmp_path / "z"),
                       "--iterations", "6", "--warmup", "1", "--resume-from", str(crafted), "--no-track")
    assert r.returncode == 2, r.stderr[-2000:]
    assert "subprocess.call" in r.stderr and "Traceback" not in r.stderr
    assert not marker.exists() and not (tmp_path / "z").exists()


def test_the_step_resumed_from_stays_for_the_ranks_while_its_training_goes_on(trained, tmp_path):
    """--resume-from a training that goes on writing and pruning checkpoints: the launcher holds the step
    it checked until the training ends, and the ranks read that step, not whatever LATEST names later."""
    from contextlib import ExitStack

    from rec.train.config import TrainConfig
    from tasks.launch import torchrun_command
    from tasks.train import TrainSettings, prepare

    live = tmp_path / "live"
    shutil.copytree(trained / "train_a" / "checkpoints", live / "checkpoints")
    settings = TrainSettings(job=TrainConfig(iterations=10, warmup=1, resume_from=str(live)))
    with ExitStack() as reading:
        _, launch = prepare(str(trained / "plan_b"), str(tmp_path / "b"), settings, reading=reading)
        held = step_dir(live / "checkpoints", 4)
        command = torchrun_command(launch)
        assert f"--resume-from={held}" in command
        for _ in range(3):
            write_next(live / "checkpoints", keep=1)
        assert sorted(p.name for p in (live / "checkpoints").iterdir() if p.is_dir()) == [held.name, "step_00000007"]
    write_next(live / "checkpoints", keep=1)
    assert not held.exists()
