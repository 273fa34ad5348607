"""replan_flow (the cron deployment): replans only when the spec's schema changed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.flows.flow_logs import as_worker, flow_log
from tests.paths import CPU_2PROC, DEMO

pytestmark = [pytest.mark.slow,  # Prefect
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]  # SQLAlchemy, from MLflow+Prefect

# Three replans as a Prefect worker runs flows: in a process of its own, without the CLI's quiet
# settings. The second finds the spec unchanged; the third replans a schema change.
REPLANS = """
import json, sys
from pathlib import Path
from flows.replan import replan_flow
from tasks.tracking import TrackingSettings

spec, topology, root = sys.argv[1:4]
def replan():
    tracking = TrackingSettings(f"sqlite:///{root}/mlflow.db", state_dir=f"{root}/state")
    state = replan_flow(spec, topology, out_dir=f"{root}/out", tracking=tracking, return_state=True)
    outcome = state.result()
    return {"flow_run": str(state.state_details.flow_run_id), "summary": outcome.summary(),
            **{k: getattr(outcome, k) for k in ("outcome", "plan_id", "spec_hash", "previous_spec_hash", "plan_path")}}
first = replan()
second = replan()
Path(spec).write_text(Path(spec).read_text() + "- {name: new_table, num_embeddings: 3000, embedding_dim: 16}\\n")
third = replan()
# two at once, as a schedule's beside one by hand: one replans, the other then finds it
Path(spec).write_text(Path(spec).read_text() + "- {name: newer_table, num_embeddings: 2000, embedding_dim: 16}\\n")
import threading
import flows.replan
barrier, looked_up = threading.Barrier(2), flows.replan.find_last_planning
def looked_up_together(*args):  # each lookup waits for the other's (a replan waiting for the lock: 3 s)
    found = looked_up(*args)
    try:
        barrier.wait(timeout=3)
    except threading.BrokenBarrierError:
        pass
    return found
flows.replan.find_last_planning = looked_up_together
both = []
pair = [threading.Thread(target=lambda: both.append(replan())) for _ in range(2)]
for t in pair:
    t.start()
for t in pair:
    t.join()
print("OUTCOMES " + json.dumps([first, second, third, *both]))
"""
NOISE = ("Downloading artifacts", "Uploading artifacts", "mlflow.store", "alembic", "View run", "it/s]")


def test_replan_records_nothing_when_unchanged_then_replans_after_a_schema_change(prefect_api, tmp_path,
                                                                                 mlflow_uri):
    from mlflow import MlflowClient

    spec = tmp_path / "tables.yaml"
    spec.write_text(DEMO.read_text())
    r = as_worker(REPLANS, str(spec), str(CPU_2PROC), str(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stdout + r.stderr
    # MLflow's progress bars and log lines stay out of a worker's output.
    assert [n for n in NOISE if n in r.stdout + r.stderr] == [], r.stdout + r.stderr
    first, second, third, *both = json.loads(r.stdout.split("OUTCOMES ", 1)[1])
    assert sorted(o["outcome"] for o in both) == ["replanned", "unchanged"]  # both replanned once
    assert both[0]["plan_id"] == both[1]["plan_id"] != third["plan_id"]

    assert (first["outcome"], second["outcome"], third["outcome"]) == ("replanned", "unchanged", "replanned")
    assert second["plan_id"] == first["plan_id"] and second["plan_path"] is None
    assert third["plan_id"] != first["plan_id"]
    assert third["previous_spec_hash"] == first["spec_hash"] != third["spec_hash"]
    # Each flow run's log ends with the line the CLI prints (then only Prefect's own "Finished").
    for outcome in (first, second, third):
        assert flow_log(outcome["flow_run"])[-1] == outcome["summary"]
    assert second["summary"].startswith("unchanged: ")

    client = MlflowClient(mlflow_uri)  # the script's store: its root's mlflow.db
    experiment = client.get_experiment_by_name("shardflow").experiment_id
    runs = client.search_runs([experiment], order_by=["attributes.start_time ASC"])
    by_step = {step: [r for r in runs if r.data.tags["shardflow.step"] == step]
               for step in ("plan", "replan")}
    # The unchanged checks recorded no MLflow run: a plan and a replan run per replanning.
    assert len(runs) == 6 and all(r.info.status == "FINISHED" for r in runs)
    replans, (replanned,) = by_step["replan"], [o for o in both if o["outcome"] == "replanned"]
    assert [r.data.tags["shardflow.replan"] for r in replans] == ["replanned"] * 3
    assert [r.data.tags["shardflow.plan_id"] for r in replans] == [o["plan_id"] for o in (first, third, replanned)]
    assert [r.data.tags["shardflow.prefect_flow_run"] for r in replans] == [
        o["flow_run"] for o in (first, third, replanned)]
    assert [p.data.tags["mlflow.parentRunId"] for p in by_step["plan"]] == [r.info.run_id for r in replans]
    assert [p.data.tags["shardflow.plan_id"] for p in by_step["plan"]] == [
        o["plan_id"] for o in (first, third, replanned)]
    # The schema change was replanned from the first plan: linked, and moving little of it.
    second_plan = by_step["plan"][1]
    assert second_plan.data.tags["shardflow.previous_plan_id"] == first["plan_id"]
    assert replans[1].data.tags["shardflow.previous_plan_id"] == first["plan_id"]
    assert second_plan.data.metrics["moved_pct"] <= 10
    # Movement as metrics, on the plan run and on the replan run's own (collapsed) row.
    for run in (second_plan, replans[1]):
        assert run.data.metrics["added_tables"] == 1 and run.data.metrics["removed_tables"] == 0
        assert run.data.metrics["kept_tables"] + run.data.metrics["resized_tables"] == 8
        assert run.data.metrics["moved_pct"] == pytest.approx(second_plan.data.metrics["moved_pct"])
        assert run.data.params["spec.name"] == "tables" and run.data.params["topology.name"] == "cpu_2proc"
    plan = json.loads(Path(replanned["plan_path"]).read_text())  # the last replan's, written where third's was
    assert replanned["plan_path"] == third["plan_path"] and plan["previous_plan_id"] == third["plan_id"]
    assert plan["metrics"]["movement"]["added_tables"] == 1
    assert (Path(replanned["plan_path"]).parent / "movement.parquet").exists()


def test_plan_replan_and_compare_see_each_others_plans(prefect_api, tmp_path, mlflow_uri, capsys):
    import re

    from flows.cli import main

    spec = tmp_path / "tables.yaml"
    spec.write_text(DEMO.read_text())
    where = ["--topology", str(CPU_2PROC), "--tracking-uri", mlflow_uri, "--state-dir", str(tmp_path / "state")]
    assert main(["plan", str(spec), *where, "--out", str(tmp_path / "v1"), "--no-chart"]) == 0
    first = json.loads((tmp_path / "v1" / "plan.json").read_text())
    assert re.search(r"^mlflow: +plan run queued for experiment 'shardflow'", capsys.readouterr().out, re.M)

    # replan finds the plan `shardflow plan` made: the spec is unchanged
    assert main(["replan", str(spec), *where, "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    assert f"unchanged: spec hash {first['spec_hash']} was last planned as plan {first['plan_id']}" in out

    # a schema change is replanned from it, and the replan prints what it moved
    spec.write_text(spec.read_text() + "- {name: new_table, num_embeddings: 3000, embedding_dim: 16}\n")
    assert main(["replan", str(spec), *where, "--out", str(tmp_path / "r")]) == 0
    out = capsys.readouterr().out
    second_id = re.search(rf"\(was {first['spec_hash']}\) -> plan (\w+) in ", out).group(1)
    assert re.search(rf"^moved: +.* from plan {first['plan_id']}", out, re.M), out
    assert re.search(r"^tables: +\d+ kept, \d+ moved, \d+ resized, 1 added, 0 removed", out, re.M), out

    # plan --previous-plan-id finds the replan's plan
    assert main(["plan", str(spec), *where, "--out", str(tmp_path / "v3"), "--no-chart",
                 "--previous-plan-id", second_id]) == 0
    assert re.search(rf"^moved: +.* from plan {second_id}", capsys.readouterr().out, re.M)
    third_id = json.loads((tmp_path / "v3" / "plan.json").read_text())["plan_id"]

    # compare names the spec and the topology of every plan, whoever made it; the plan run of the
    # last `shardflow plan` waits for the next command that records, and compare says so
    state = ["--tracking-uri", mlflow_uri, "--state-dir", str(tmp_path / "state")]
    assert main(["compare", *state, "--wide"]) == 0
    out = capsys.readouterr().out
    # the command as it works typed here: this state folder, not the default one
    assert "1 record(s) wait in" in out and f"`shardflow outbox retry --state-dir {tmp_path / 'state'}` delivers" in out
    # that record is the experiment shardflow's: compare for another experiment does not count it as its own
    assert main(["compare", *state, "--experiment", "other"]) == 0
    out = capsys.readouterr().out
    assert "for MLflow, not shown" not in out
    assert (f"1 record(s) wait in {tmp_path / 'state' / 'outbox'} for another store or experiment: "
            f"`shardflow outbox list --state-dir {tmp_path / 'state'}` names them") in out
    assert main(["outbox", "list", "--state-dir", str(tmp_path / "state")]) == 0
    listed = capsys.readouterr().out.splitlines()
    assert listed[0].split()[:5] == ["entry", "state", "record", "for", "experiment"]
    assert listed[2].split()[-4:-2] == [mlflow_uri, "shardflow"] and " plan run " in listed[2], listed
    assert main(["outbox", "retry", *state]) == 0
    capsys.readouterr()
    assert main(["compare", *state, "--wide"]) == 0
    rows = {line.split()[0]: line.split() for line in capsys.readouterr().out.splitlines()[2:] if line.strip()}
    assert set(rows) == {first["plan_id"], second_id, third_id}
    assert all(row[2:4] == ["tables", "cpu_2proc"] for row in rows.values()), rows
