"""Your own model with a shardflow plan, on 2 gloo processes: the example script of
docs/own-training-script.md (spec from the model, plan, DMP with the plan under torchrun), and the
same model trained by ``shardflow train --model TARGET``. What DMP applied is read back from the
sharded modules, not from the plan."""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest

from tests.flows.cli_in_process import shardflow_here
from tests.paths import CPU_2PROC, ROOT, TORCHRUN, TWO_TOWER_SEQ

EXAMPLE = "examples/train_own_model.py"


def run(temp: Path, *cmd: str | Path) -> subprocess.CompletedProcess:
    """``cmd`` as a user runs it; torchrun's per-run directory (its default log directory) lands in ``temp``."""
    return subprocess.run([str(c) for c in cmd], capture_output=True, text=True, cwd=ROOT, timeout=600,
                          env={**os.environ, "OMP_NUM_THREADS": "1", "TMPDIR": str(temp)})


@pytest.fixture(scope="module")
def own_plan(tmp_path_factory):
    """``shardflow spec from-model examples/train_own_model.py:build_model``, then ``shardflow plan``
    on two cpu ranks: the same functions the two commands run, in this process."""
    from rec.plan import read_plan, write_plan
    from rec.planning import plan_spec
    from rec.spec.from_model import spec_from_model
    from rec.topology import read_topology

    found = spec_from_model(f"{ROOT / EXAMPLE}:build_model")
    assert found.left_out == () and set(found.spec.modules) == {"user.ebc", "sequence.0.ec"}
    directory = tmp_path_factory.mktemp("own") / "plan"
    write_plan(plan_spec(found.spec, read_topology(CPU_2PROC)), directory)
    return directory, read_plan(directory)


@pytest.mark.slow
def test_the_example_script_trains_the_model_sharded_exactly_as_planned(own_plan, tmp_path):
    from rec.train.applied import planned_tables

    directory, plan = own_plan
    r = run(tmp_path, TORCHRUN, "--standalone", "--nproc-per-node", "2", EXAMPLE, "--plan", directory,
            "--iterations", "4", "--applied", tmp_path / "applied.json")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    losses = [float(line.rsplit(" ", 1)[1]) for line in r.stdout.splitlines() if line.startswith("iteration ")]
    assert len(losses) == 4 and all(math.isfinite(x) for x in losses)
    applied = json.loads((tmp_path / "applied.json").read_text())
    assert sorted(applied, key=lambda t: (t["module"], t["name"])) == sorted(
        (t.to_dict() for t in planned_tables(plan)), key=lambda t: (t["module"], t["name"]))
    assert {t["module"] for t in applied} == {"user.ebc", "sequence.0.ec"}
    assert {s["rank"] for t in applied for s in t["shards"]} == {0, 1}  # both ranks hold tables
    import sys

    # a plan path given from another directory: its problem in one message, no traceback (one process suffices)
    wrong = subprocess.run([sys.executable, ROOT / EXAMPLE, "--plan", "out/own_plan"], capture_output=True, text=True,
                           cwd=tmp_path, timeout=300)
    assert wrong.returncode == 2 and "Traceback" not in wrong.stderr, wrong.stderr
    assert "out/own_plan: no such file" in wrong.stderr and f"(working directory {tmp_path})" in wrong.stderr


@pytest.mark.slow
def test_shardflow_train_trains_the_users_model_factory_with_the_plan(own_plan, tmp_path, capfd, monkeypatch):
    directory, plan = own_plan
    target = f"{EXAMPLE}:shardflow_model"
    monkeypatch.chdir(ROOT)  # the target is relative to it
    r = shardflow_here(capfd, "train", "--no-track", "--plan", str(directory), "--out", str(tmp_path), "--model",
                       target, "--iterations", "6", "--warmup", "1", "--batch-size", "32")
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    m = json.loads((tmp_path / "train_metrics.json").read_text())
    assert m["model"] == target and m["plan_id"] == plan.plan_id
    assert m["applied_sharding"] == {t.key: t.sharding_type.value for t in plan.tables}
    assert 0 < m["iteration_latency_ms"]["p50"] and math.isfinite(m["loss"]["last"])
    assert "loss" in r.stdout


@pytest.mark.slow
def test_a_users_model_whose_code_chose_sgd_for_a_sharded_table_resumes(own_plan, users_code, tmp_path, capfd):
    """The table's SGD is fused into its sharded kernels, stateless: a resume asked the checkpoint for
    its state ("Missing key in checkpoint state_dict", exit 1)."""
    directory, _ = own_plan
    common = ["train", "--no-track", "--plan", str(directory), "--out", str(tmp_path / "out"), "--model",
              f"{users_code}:sgd_on_one_table", "--warmup", "1", "--batch-size", "32", "--checkpoint-every", "2"]
    first = shardflow_here(capfd, *common, "--iterations", "2")
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    resumed = shardflow_here(capfd, *common, "--iterations", "3", "--resume")
    assert resumed.returncode == 0, resumed.stdout[-3000:] + resumed.stderr[-3000:]
    assert json.loads((tmp_path / "out" / "train_metrics.json").read_text())["resumed_from"] == 2


USERS_CODE = f"""
import sys
sys.path.insert(0, {str(ROOT / "examples")!r})
from train_own_model import ShopModel, batches


class Stop(BaseException):
    pass


def exits_0():
    sys.exit(0)


def exits_3():
    sys.exit(3)


def raises_base_exception():
    raise Stop("the user's code stops here")


def sgd_on_one_table():
    import torch
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward

    model = ShopModel()
    apply_optimizer_in_backward(torch.optim.SGD, [model.user.ebc.embedding_bags["user_id_table"].weight], {{"lr": 0.5}})
    return model, batches


def exits_in_its_batches():
    def leaving(rank, world_size, batch_size, device):
        source = batches(rank, world_size, batch_size, device)
        yield next(source)
        yield next(source)
        sys.exit(0)
    return ShopModel(), leaving
"""
ENDINGS = {"exits_0": "called sys.exit(0) instead of returning", "exits_3": "called sys.exit(3) instead of returning",
           "raises_base_exception": "raised Stop: the user's code stops here"}


@pytest.fixture
def users_code(tmp_path):
    path = tmp_path / "um.py"
    path.write_text(USERS_CODE)
    return path


@pytest.mark.parametrize("function", list(ENDINGS))
def test_a_users_function_that_exits_or_raises_a_base_exception_exits_2_naming_it(own_plan, users_code, tmp_path,
                                                                                 function, capfd):
    """sys.exit(0) is no model read, nor a training done; sys.exit(3) and a BaseException are no
    crash: each is the user's mistake, named with the target, exit 2, nothing written or launched.
    (The commands run in this process: the user's exit must not leave it either.)"""
    target = f"{users_code}:{function}"
    spec = tmp_path / "x.yaml"
    r = shardflow_here(capfd, "spec", "from-model", target, "--out", str(spec))
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"{target}() {ENDINGS[function]}" in r.stderr and "Traceback" not in r.stderr
    assert not spec.exists()

    directory, _ = own_plan
    r = shardflow_here(capfd, "train", "--no-track", "--plan", str(directory), "--out", str(tmp_path / "train"),
                       "--model", target)
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert f"{target}() {ENDINGS[function]}" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "train" / "logs").exists()  # nothing was launched


@pytest.mark.slow
def test_batches_that_exit_inside_the_ranks_fail_the_training_with_exit_2_naming_the_target(own_plan, users_code,
                                                                                         tmp_path, capfd,
                                                                                         monkeypatch):
    """The user's batches run in the rank processes only: an exit there fails each rank with
    the target as its cause (a failure a retry would repeat), not a rank that ends as if it finished.
    (The command runs in this process, which the ranks' exits must not reach either.)"""
    directory, _ = own_plan
    target = f"{users_code}:exits_in_its_batches"
    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # as run() starts a command
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # torchrun's per-run directory
    r = shardflow_here(capfd, "train", "--no-track", "--plan", str(directory), "--out", str(tmp_path / "train"),
                       "--model", target, "--iterations", "6", "--warmup", "1", "--batch-size", "32")
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert "the training failed" in r.stderr and "Traceback" not in r.stderr
    assert f"{target}: its code called sys.exit(0) while training" in r.stderr
    error = json.loads((tmp_path / "train" / "logs" / "rank-0.error.json").read_text())
    assert error["deterministic"] and target in error["cause"]
    assert not (tmp_path / "train" / "train_metrics.json").exists()


def test_a_model_that_does_not_match_the_plan_exits_2_naming_each_difference_before_launch(tmp_path, capfd):
    from rec.plan import write_plan
    from rec.planning import plan_spec
    from rec.spec import read_spec
    from rec.topology import read_topology

    write_plan(plan_spec(read_spec(TWO_TOWER_SEQ), read_topology(CPU_2PROC)), tmp_path / "plan")
    r = shardflow_here(capfd, "train", "--no-track", "--plan", str(tmp_path / "plan"), "--out",
                       str(tmp_path / "train"), "--model", f"{ROOT / EXAMPLE}:shardflow_model")
    assert r.returncode == 2, r.stdout[-3000:] + r.stderr[-3000:]
    assert "Traceback" not in r.stderr and "the plan does not shard" in r.stderr
    for where in ("module towers.user.ebc", "module sequence.ec", "module user.ebc", "module sequence.0.ec"):
        assert where in r.stderr
    assert not (tmp_path / "train" / "logs").exists()  # nothing was launched


def test_shardflow_run_checks_the_model_target_against_the_spec_before_planning(tmp_path, capfd):
    r = shardflow_here(capfd, "run", str(TWO_TOWER_SEQ), "--topology", str(CPU_2PROC), "--out",
                       str(tmp_path / "run"), "--model", f"{ROOT / EXAMPLE}:shardflow_model",
                       "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}")
    assert r.returncode == 2 and "module towers.user.ebc" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "run").exists() and not (tmp_path / "mlflow.db").exists()  # nothing planned or run


def test_the_flows_take_a_model_target_as_their_model_parameter():
    import flows.pipeline
    import flows.train

    target = f"{EXAMPLE}:shardflow_model"
    training = {"job": {"model": target}}
    validated = flows.train.train_flow.validate_parameters({"plan_path": "p", "training": training})
    assert validated["training"].job.model == target
    params = {"spec_path": "s", "topology_path": "t", "training": training}
    assert flows.pipeline.pipeline_flow.validate_parameters(params)["training"].job.model == target
