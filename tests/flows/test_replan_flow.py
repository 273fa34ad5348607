"""replan_flow (the cron deployment): replans only when the spec's schema changed."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "specs" / "cpu_demo.yaml"
CPU_2PROC = ROOT / "examples" / "topologies" / "cpu_2proc.yaml"
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow+Prefect


def test_replan_records_unchanged_then_replans_after_a_schema_change(prefect_api, tmp_path):
    from mlflow import MlflowClient

    from flows.replan import replan_flow

    spec = tmp_path / "tables.yaml"
    spec.write_text(DEMO.read_text())
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"

    def replan():
        return replan_flow(str(spec), str(CPU_2PROC), out_dir=str(tmp_path / "out"),
                           tracking_uri=uri, state_dir=str(tmp_path / "state"))

    first = replan()  # nothing planned this spec file before
    second = replan()
    spec.write_text(DEMO.read_text() + "- {name: new_table, num_embeddings: 3000, embedding_dim: 16}\n")
    third = replan()

    assert (first.outcome, second.outcome, third.outcome) == ("replanned", "unchanged", "replanned")
    assert second.plan_id == first.plan_id and second.plan_path is None
    assert third.plan_id != first.plan_id
    assert third.previous_spec_hash == first.spec_hash != third.spec_hash

    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("shardflow").experiment_id
    runs = client.search_runs([experiment], order_by=["attributes.start_time ASC"])
    by_step = {step: [r for r in runs if r.data.tags["shardflow.step"] == step]
               for step in ("plan", "replan")}
    assert len(runs) == 5 and all(r.info.status == "FINISHED" for r in runs)
    assert [r.data.tags["shardflow.replan"] for r in by_step["replan"]] == \
        ["replanned", "unchanged", "replanned"]
    assert [r.data.tags["shardflow.plan_id"] for r in by_step["replan"]] == \
        [first.plan_id, first.plan_id, third.plan_id]
    replanned = [r for r in by_step["replan"] if r.data.tags["shardflow.replan"] == "replanned"]
    assert [p.data.tags["mlflow.parentRunId"] for p in by_step["plan"]] == \
        [r.info.run_id for r in replanned]
    assert [p.data.tags["shardflow.plan_id"] for p in by_step["plan"]] == [first.plan_id, third.plan_id]
    # The schema change was replanned from the first plan: linked, and moving little of it.
    second_plan = by_step["plan"][1]
    assert second_plan.data.tags["shardflow.previous_plan_id"] == first.plan_id
    assert replanned[1].data.tags["shardflow.previous_plan_id"] == first.plan_id
    assert second_plan.data.metrics["moved_fraction"] <= 0.10
    import json

    plan = json.loads(Path(third.plan_path).read_text())
    assert plan["previous_plan_id"] == first.plan_id
    assert plan["metrics"]["movement"]["added_tables"] == 1
    assert (Path(third.plan_path).parent / "movement.parquet").exists()
