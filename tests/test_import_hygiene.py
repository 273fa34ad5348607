"""The planning path stays light: the library, `shardflow plan` and `shardflow spec` import no torch
and no orchestration (Prefect, Ray, MLflow); they would add seconds to every command. Nor do the
checks `shardflow train` makes before it starts the launcher, which imports torch itself."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.paths import CPU_2PROC, DEMO, H100, ROOT, SHARDFLOW, SPECS, TWO_TOWER_SEQ

ORCHESTRATION = ("prefect", "ray", "mlflow")
TORCH = ("torch", "torchrec", "fbgemm_gpu")
# What each path runs (demo, cpu, h100, towers, specs and out are the script's arguments), and
# what it must not import.
CASES = {
    "the library": (
        "import rec.cost, rec.plan, rec.planning, rec.search, rec.spec, rec.spec.synthetic, rec.topology, rec.units",
        TORCH + ORCHESTRATION),
    "shardflow plan, its plan run queued for MLflow": (
        "from flows.cli import main\n"
        "assert main(['plan', demo, '--topology', cpu, '--out', out, '--state-dir', out + '-state']) == 0\n"
        "import os; assert os.listdir(out + '-state/outbox')",
        TORCH + ORCHESTRATION),
    "shardflow spec show and validate": (
        "from flows.cli import main\n"
        "assert main(['spec', 'show', f'{specs}/criteo_1tb.yaml', '--topology', h100]) == 0\n"
        "assert main(['spec', 'validate', f'{specs}/cpu_demo.csv']) == 0",
        TORCH + ORCHESTRATION),
    "planning, writing and reading back a plan of several modules": (
        "from rec.analysis import check_plan\n"
        "from rec.plan import read_plan, write_plan\n"
        "from rec.planning import plan_spec\n"
        "from rec.spec import read_spec\n"
        "from rec.topology import topology_from_dict\n"
        "topology = topology_from_dict({'world_size': 2, 'local_world_size': 2, 'compute_device': 'cuda'})\n"
        "write_plan(plan_spec(read_spec(towers), topology), out)\n"
        "check_plan(read_plan(out))",
        TORCH),
    # The launcher imports torch anyway; the command before it only where it reads a checkpoint.
    "the checks before a cpu training that resumes (no checkpoint yet)": (
        "from flows.cli import main\n"
        "assert main(['plan', '--no-track', demo, '--topology', cpu, '--out', out]) == 0\n"
        "from rec.train.config import TrainConfig\n"
        "from tasks.train import TrainSettings, prepare\n"
        "job = TrainConfig(resume=True, checkpoint_every=2)\n"
        "assert prepare(out + '/plan.json', out + '/train', TrainSettings(job=job))[1].nproc_per_node == 2",
        TORCH),
}


@pytest.mark.parametrize("case", CASES)
def test_planning_paths_import_no_torch_or_orchestration(case, tmp_path):
    code, forbidden = CASES[case]
    script = ("import sys\n"
              "demo, cpu, h100, towers, specs, out = sys.argv[1:]\n"
              f"{code}\n"
              f"print('IMPORTED', sorted(m for m in {forbidden!r} if m in sys.modules))\n")
    args = [DEMO, CPU_2PROC, H100, TWO_TOWER_SEQ, SPECS, tmp_path / "out"]
    r = subprocess.run([sys.executable, "-c", script, *map(str, args)], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.splitlines()[-1] == "IMPORTED []"


def test_a_module_named_like_a_shardflow_package_on_pythonpath_does_not_take_its_place(tmp_path):
    """A `tasks.py` on PYTHONPATH (invoke's file is called that) stopped every command with
    `ModuleNotFoundError: No module named 'tasks.search'; 'tasks' is not a package`."""
    (tmp_path / "tasks.py").write_text("raise SystemExit('the user\\'s own tasks.py was imported')\n")
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(tmp_path), "PYTHONDONTWRITEBYTECODE": "1"}
    r = subprocess.run([str(SHARDFLOW), "spec", "validate", str(SPECS / "cpu_demo.csv")],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr[-2000:]
