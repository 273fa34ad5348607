"""MLflow away: plans wait in the outbox on local disk and reach MLflow when it is back."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.paths import CPU_2PROC, DEMO

pytestmark = [pytest.mark.slow,  # Prefect
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]  # SQLAlchemy, from MLflow+Prefect


def test_a_plan_waits_in_the_outbox_while_mlflow_is_away_and_is_logged_when_it_returns(
        prefect_api, tmp_path):
    from mlflow import MlflowClient

    from flows.plan import plan_flow
    from rec.plan import read_plan
    from tasks.outbox import Outbox
    from tasks.plan_fetch import fetch_plan
    from tasks.tracking import TrackingSettings, tracking_for

    state, out = str(tmp_path / "state"), str(tmp_path / "out")
    blocker = tmp_path / "store"
    blocker.write_text("")  # the store's directory cannot exist while this file is in the way
    uri = f"sqlite:///{blocker / 'mlflow.db'}"
    first = plan_flow(str(DEMO), str(CPU_2PROC), out_dir=out, tracking=TrackingSettings(uri, state_dir=state))
    assert first.logged.run_id is None and first.logged.pending == 1
    outbox = Outbox(Path(state, "outbox"))
    (entry,) = outbox.entries()
    assert {p.name for p in entry.iterdir()} == {"record.json", "to.json", "plan.json", "shards.parquet",
                                                 "rank_load.png", "attempts.json"}  # why it waits
    # Another store in the meantime takes nothing meant for this one.
    elsewhere = f"sqlite:///{tmp_path / 'other.db'}"
    plan_flow(str(DEMO), str(CPU_2PROC), out_dir=out, tracking=TrackingSettings(elsewhere, state_dir=state))
    assert len(outbox.entries()) == 1
    # Still usable meanwhile: --plan-id finds the plan in the outbox.
    fetched = fetch_plan(tracking_for(uri, state_dir=state), first.plan_id, tmp_path / "fetched")
    assert read_plan(fetched).plan_id == first.plan_id

    blocker.unlink()  # the store is back
    second = plan_flow(str(DEMO), str(CPU_2PROC), out_dir=out, tracking=TrackingSettings(uri, state_dir=state))
    assert second.cached and second.plan_id == first.plan_id
    assert outbox.entries() == []
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("shardflow").experiment_id
    (run,) = client.search_runs([experiment])
    assert run.info.run_id == second.logged.run_id
    assert run.data.tags["shardflow.step"] == "plan" and run.data.tags["shardflow.plan_id"] == first.plan_id
    assert run.data.params["tables"] == "8" and "critical_path_ms" in run.data.metrics
    assert {a.path for a in client.list_artifacts(run.info.run_id)} == \
        {"plan.json", "shards.parquet", "rank_load.png"}
