"""A spec of several embedding modules (two EmbeddingBagCollection towers and a sequence
EmbeddingCollection) plans and trains through ``shardflow run`` on 2 gloo processes, and a training
of a changed plan resumes from its checkpoint table by table (tables of one name in two modules
kept apart)."""

from __future__ import annotations

import contextlib
import io
import json
from pathlib import Path

import pytest

from flows.cli import main
from rec.train.resume import step_dir
from tests.flows.checkpoint_state import full_state
from tests.flows.cli_in_process import shardflow_here
from tests.paths import CPU_2PROC, TWO_TOWER_SEQ
from tests.stores import store_from

pytestmark = [pytest.mark.slow,  # real torchrun trainings
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]  # SQLAlchemy, from MLflow+Prefect

SEQUENCE_ITEMS = "model.sequence.ec.embeddings.item_id.weight"  # checkpoint keys: "model." + the path
TOWER_ITEMS = "model.towers.item.ebc.embedding_bags.item_id.weight"
SEARCH = "model.sequence.ec.embeddings.search_tokens.weight"


@pytest.fixture(scope="module")
def pipeline_run(prefect_api, tmp_path_factory, mlflow_template) -> Path:
    out = tmp_path_factory.mktemp("two_tower_seq")
    store_from(mlflow_template, out)
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["run", str(TWO_TOWER_SEQ), "--topology", str(CPU_2PROC), "--train-iterations", "6",
                     "--warmup", "1", "--batch-size", "32", "--checkpoint-every", "6", "--out", str(out / "run"),
                     "--tracking-uri", f"sqlite:///{out / 'mlflow.db'}", "--state-dir", str(out / "state")])
    assert code == 0, stdout.getvalue() + stderr.getvalue()
    return out


def test_shardflow_run_plans_and_trains_every_module_of_the_spec(pipeline_run):
    from rec.plan import read_plan

    plan = read_plan(pipeline_run / "run" / "plan")
    m = json.loads((pipeline_run / "run" / "train" / "train_metrics.json").read_text())
    assert plan.format == "shardflow.plan/v3"
    assert m["applied_sharding"] == {t.key: t.sharding_type.value for t in plan.tables}
    assert {key.rsplit(".", 1)[0] for key in m["applied_sharding"]} == {"towers.user.ebc", "towers.item.ebc",
                                                                         "sequence.ec"}
    assert m["model"] == "dlrm" and m["iterations"] == 6 and m["loss"]["last"] > 0


def test_a_changed_plan_resumes_each_module_table_from_the_checkpoint(pipeline_run, tmp_path, capfd):
    grown = TWO_TOWER_SEQ.read_text().replace("num_embeddings: 20000", "num_embeddings: 30000")
    assert grown != TWO_TOWER_SEQ.read_text()
    (tmp_path / "grown.yaml").write_text(grown)
    assert main(["plan", "--no-track", str(tmp_path / "grown.yaml"), "--topology", str(CPU_2PROC), "--out",
                 str(tmp_path / "plan"),
                 "--no-chart"]) == 0
    r = shardflow_here(capfd, "train", "--plan", str(tmp_path / "plan"), "--out", str(tmp_path / "train"),
                       "--iterations", "8", "--warmup", "1", "--batch-size", "32", "--checkpoint-every", "100",
                       "--no-track", "--resume-from", str(pipeline_run / "run" / "train"))
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    resume = json.loads((tmp_path / "train" / "train_metrics.json").read_text())["resume"]
    assert (resume["step"], resume["tables_restored"], resume["tables_resized"]) == (6, 6, 1)

    old = full_state(step_dir(pipeline_run / "run" / "train" / "checkpoints", 6), tmp_path)
    new = full_state(step_dir(tmp_path / "train" / "checkpoints", 6), tmp_path)  # the new layout, as loaded
    import torch

    for key in (SEQUENCE_ITEMS, TOWER_ITEMS):
        assert torch.equal(new[key], old[key]), key
    assert not torch.equal(old[SEQUENCE_ITEMS], old[TOWER_ITEMS])  # two tables, one name
    assert new[SEARCH].shape == (30000, 32) and torch.equal(new[SEARCH][:20000], old[SEARCH])
    momentum = "optim.state.sequence.ec.embeddings.search_tokens.weight.search_tokens.momentum1"
    assert torch.equal(new[momentum][:20000], old[momentum]) and old[momentum].abs().sum() > 0
