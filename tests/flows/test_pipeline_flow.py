"""The pipeline on real Prefect (test harness), MLflow (SQLite) and torchrun (2 gloo processes)."""

from __future__ import annotations

import contextlib
import io
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from flows.cli import main
from tasks.tracking import TrackingSettings
from tests.flows.flow_logs import as_worker, flow_log
from tests.paths import CPU_2PROC, DEMO, SHARDFLOW
from tests.stores import store_from

pytestmark = [pytest.mark.slow,  # Prefect and real torchrun trainings
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]  # SQLAlchemy, from MLflow+Prefect
TINY_TRAINING = ["--train-iterations", "6", "--warmup", "1", "--batch-size", "32"]


@dataclass(frozen=True)
class Store:
    root: Path

    @property
    def uri(self) -> str:
        return f"sqlite:///{self.root / 'mlflow.db'}"

    @property
    def state(self) -> str:
        return str(self.root / "state")

    @property
    def out(self) -> str:
        return str(self.root / "out")

    def args(self) -> list[str]:
        return ["--tracking-uri", self.uri, "--state-dir", self.state]

    def tracking(self) -> TrackingSettings:
        """The flows' ``tracking`` parameter for this store."""
        return TrackingSettings(self.uri, state_dir=self.state)

    def runs(self, step: str | None = None) -> list:
        from mlflow import MlflowClient

        client = MlflowClient(self.uri)
        experiment = client.get_experiment_by_name("shardflow")
        assert experiment is not None
        runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time ASC"])
        return [r for r in runs if step is None or r.data.tags["shardflow.step"] == step]


@pytest.fixture(scope="module")
def store(tmp_path_factory, mlflow_template) -> Store:
    root = tmp_path_factory.mktemp("pipeline")
    store_from(mlflow_template, root)
    return Store(root)


@dataclass(frozen=True)
class Output:
    out: str
    err: str


@pytest.fixture(scope="module")
def first_run(prefect_api, store) -> Output:
    """``shardflow run`` once, its output captured as a pipe would (not a terminal)."""
    stdout, stderr = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
        code = main(["run", str(DEMO), "--topology", str(CPU_2PROC), *TINY_TRAINING,
                     "--out", store.out, *store.args()])
    assert code == 0, stdout.getvalue() + stderr.getvalue()
    return Output(stdout.getvalue(), stderr.getvalue())


def plan_id_of(store: Store) -> str:
    return json.loads(Path(store.out, "plan", "plan.json").read_text())["plan_id"]


def test_run_records_a_pipeline_run_with_nested_plan_and_train_runs(first_run, store):
    from mlflow import MlflowClient

    plan_id = plan_id_of(store)
    (pipeline,), (plan,), (train,) = store.runs("pipeline"), store.runs("plan"), store.runs("train")
    for run in (pipeline, plan, train):
        assert run.info.status == "FINISHED"
        assert run.data.tags["shardflow.plan_id"] == plan_id
    assert plan.data.tags["mlflow.parentRunId"] == pipeline.info.run_id
    assert train.data.tags["mlflow.parentRunId"] == pipeline.info.run_id

    assert {k: plan.data.params[k] for k in ("tables", "world_size", "backend", "groups")} == \
        {"tables": "8", "world_size": "2", "backend": "local", "groups": "1"}
    assert {"planning_s", "critical_path_ms", "lower_bound_ms", "max_hbm_gib"} <= set(plan.data.metrics)
    # What a comparison needs, as params and metrics with units (MLflow's UI shows them per run).
    plan_json = json.loads(Path(store.out, "plan", "plan.json").read_text())
    topology = {f"topology.{k}": str(v) for k, v in plan_json["topology"].items()}
    assert {"topology.world_size", "topology.local_world_size", "topology.compute_device", "topology.hbm_cap",
            "topology.ddr_cap", "topology.intra_host_bw", "topology.batch_size"} <= set(topology)
    comparison = {**topology, "spec.name": "cpu_demo", "spec.hash": plan_json["spec_hash"],
                  "topology.name": "cpu_2proc", "profile.name": "default",
                  "search.time_limit_s": str(plan_json["planner"]["search"]["time_limit_s"]),
                  "cost.optimizer": plan_json["planner"]["cost"]["optimizer"]}
    for run in (plan, train, pipeline):
        assert {k: run.data.params.get(k) for k in comparison} == comparison, run.data.tags["shardflow.step"]
    predicted = plan_json["metrics"]["critical_path"]
    assert plan.data.metrics["critical_path_ms"] == predicted
    assert plan.data.metrics["gap_pct"] == pytest.approx(100 * plan_json["metrics"]["gap"])
    client = MlflowClient(store.uri)
    assert {a.path for a in client.list_artifacts(plan.info.run_id)} == \
        {"plan.json", "shards.parquet", "rank_load.png"}
    png = Path(client.download_artifacts(plan.info.run_id, "rank_load.png", str(store.root / "dl")))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    metrics = json.loads(Path(store.out, "train", "train_metrics.json").read_text())
    assert train.data.metrics["measured_iteration_ms"] == metrics["iteration_latency_ms"]["p50"]
    assert {"measured_iteration_p90_ms", "samples_per_s"} <= set(train.data.metrics)
    series = client.get_metric_history(train.info.run_id, "per_iteration/latency_ms")
    assert sorted(m.step for m in series) == list(range(6))
    # Predicted beside measured: in train_metrics.json, the train run, and the pipeline run's own row.
    assert metrics["predicted_critical_path_ms"] == predicted
    assert train.data.metrics["predicted_iteration_ms"] == predicted
    headline = {k: pipeline.data.metrics.get(k) for k in (
        "critical_path_ms", "gap_pct", "predicted_iteration_ms", "measured_iteration_ms",
        "measured_iteration_p90_ms", "samples_per_s")}
    assert headline == {**{k: plan.data.metrics[k] for k in ("critical_path_ms", "gap_pct")},
                        **{k: train.data.metrics[k] for k in list(headline)[2:]}}
    flow_run = {run.data.tags.get("shardflow.prefect_flow_run") for run in (pipeline, plan, train)}
    assert len(flow_run) == 1 and None not in flow_run  # all three name the flow run that recorded them

    for where in ("plan.json", plan_id, "train_metrics.json", "shardflow ui",
                  pipeline.info.run_id):
        assert where in first_run.out


def test_a_run_without_a_terminal_shows_progress_lines_and_the_time_of_each_step(first_run, store):
    from mlflow import MlflowClient
    from prefect import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    lines = first_run.err.splitlines()
    assert any(line.startswith("train: ") and "[" in line for line in lines), first_run.err
    assert any(line.startswith("train: done in") for line in lines)
    assert "Traceback" not in first_run.err and "Starting temporary server" not in first_run.err
    (time_line,) = [line for line in first_run.out.splitlines() if line.startswith("time")]
    for step in ("ingest", "search", "write", "train", "MLflow", "total"):
        assert step in time_line
    hints = [line.split()[1] for line in first_run.out.splitlines()
             if line.split()[:1] in (["show"], ["browse"], ["compare"])]
    assert len(hints) == 3 and all(shutil.which(hint) for hint in hints)  # they work as typed from here

    # The loss is recorded: first/last/mean in train_metrics.json, a series in MLflow.
    metrics = json.loads(Path(store.out, "train", "train_metrics.json").read_text())
    assert set(metrics["loss"]) == {"first", "last", "mean"}
    (train,) = store.runs("train")
    assert train.data.metrics["loss_last"] == metrics["loss"]["last"]
    assert len(MlflowClient(store.uri).get_metric_history(train.info.run_id, "per_iteration/loss")) == 6
    # The per-rank table is a Prefect artifact naming the plan's MLflow run, which names the flow run.
    # Read among every artifact of that key: the test server is the run's, and other workers' tests
    # plan the demo too (the latest of a key may be theirs).
    (plan_run,) = store.runs("plan")
    with get_client(sync_client=True) as client:
        keyed = client.read_artifacts(artifact_filter=ArtifactFilter(
            key=ArtifactFilterKey(any_=[f"plan-{plan_id_of(store)}"])))
    (artifact,) = [a for a in keyed if plan_run.info.run_id in str(a.data)]
    assert "<- critical path" in str(artifact.data)
    assert plan_run.data.tags["shardflow.prefect_flow_run"] == str(artifact.flow_run_id)


def test_rerunning_an_unchanged_plan_searches_nothing_and_adds_no_plan_run(first_run, store):
    from flows.plan import plan_flow

    outcome = plan_flow(str(DEMO), str(CPU_2PROC), out_dir=store.out, tracking=store.tracking())
    (plan_run,) = store.runs("plan")
    assert outcome.cached
    assert outcome.plan_id == plan_id_of(store)
    assert outcome.logged.run_id == plan_run.info.run_id


# The plan and pipeline flows as a Prefect worker runs them: in a process of its own, logging at INFO.
# The pipeline gets its settings objects, as ``shardflow run`` builds them; rank 1 of its training's
# first attempt dies at iteration 2 (no restart by torchrun), and Prefect retries the training once.
FLOWS = """
import json, os, sys
from flows.pipeline import pipeline_flow
from flows.plan import plan_flow
from rec.train.config import FAIL_AT_ENV, TrainConfig
from tasks.search import SearchSettings
from tasks.tracking import TrackingSettings
from tasks.train import TrainSettings

spec, topology, root = sys.argv[1:4]
common = dict(tracking=TrackingSettings(f"sqlite:///{root}/mlflow.db", state_dir=f"{root}/state"),
              return_state=True)
training = TrainSettings(job=TrainConfig(iterations=4, warmup=1, batch_size=32), max_restarts=0)
states = {"plan": plan_flow(spec, topology, out_dir=f"{root}/plan", **common)}
os.environ[FAIL_AT_ENV] = "2:1"  # rank 1 dies at iteration 2 (of the first attempt only)
states["pipeline"] = pipeline_flow(spec, topology, searching=SearchSettings(), training=training, train_retries=1,
                                   train_retry_delay_s=0, out_dir=f"{root}/run", **common)
print("RUNS " + json.dumps({name: [str(state.state_details.flow_run_id), state.result().summary()]
                            for name, state in states.items()}))
outcome = states["pipeline"].result()
print("PIPELINE " + json.dumps({"attempts": outcome.trained.attempts, "cached": outcome.cached,
                                "plan_id": outcome.plan_id, "planned": states["plan"].result().plan_id}))
"""


@pytest.mark.usefixtures("mlflow_uri")  # the script's store, tmp_path/mlflow.db, made beforehand
def test_the_flow_logs_end_with_the_lines_the_cli_prints_and_a_failed_training_is_retried_without_replanning(
        prefect_api, first_run, tmp_path):
    """The plan flow, then the pipeline flow, in a process of their own as a Prefect worker runs
    them: each flow run's log ends with the lines ``shardflow run`` prints. The pipeline's training
    fails once (a rank dies): Prefect retries it, the retry and the whole pipeline search nothing
    (the plan flow's plan, from the cache), and MLflow has one train run, of 2 attempts, under the
    pipeline run."""
    r = as_worker(FLOWS, str(DEMO), str(CPU_2PROC), str(tmp_path), cwd=tmp_path)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    runs = json.loads(r.stdout.split("RUNS ", 1)[1].splitlines()[0])
    for flow_run, summary in runs.values():
        assert flow_log(flow_run)[-1] == summary
    assert runs["plan"][1].startswith("plan      ")
    # planned under TorchRec's defaults: a note says why the measured time is far from the prediction
    assert [line.split()[0] for line in runs["pipeline"][1].splitlines()] == \
        ["plan", "training", "predicted", "note", "data"]
    assert "(2 attempts)" in runs["pipeline"][1].splitlines()[1]
    # ``shardflow run`` prints the same lines first (its plan_id and paths differ from this run's).
    assert [line.split()[0] for line in first_run.out.splitlines()[:3]] == ["plan", "training", "predicted"]

    outcome = json.loads(r.stdout.split("PIPELINE ", 1)[1].splitlines()[0])
    assert outcome["attempts"] == 2
    assert outcome["cached"]  # the retry, and this whole pipeline, searched nothing
    store = Store(tmp_path)
    assert len(store.runs("plan")) == 1  # the plan flow's
    pipeline = store.runs("pipeline")[-1]
    train = store.runs("train")[-1]
    assert train.data.tags["shardflow.attempts"] == "2"
    assert train.data.tags["shardflow.plan_id"] == outcome["plan_id"] == outcome["planned"]
    assert train.data.tags["mlflow.parentRunId"] == pipeline.info.run_id
    nested = [r for r in store.runs() if r.data.tags.get("mlflow.parentRunId") == pipeline.info.run_id]
    assert [r.data.tags["shardflow.step"] for r in nested] == ["train"]


def test_train_plan_id_fetches_the_plan_from_its_mlflow_run(first_run, store, tmp_path, capfd, monkeypatch):
    plan_id = plan_id_of(store)
    # 3 processes for a 2-rank plan: the plan is fetched and checked, then refused (no training).
    code = main(["train", "--plan-id", plan_id, "--out", str(tmp_path), "--nproc-per-node", "3",
                 *store.args()])
    out, err = capfd.readouterr()
    assert code == 2
    assert f"fetched plan {plan_id}" in out and "2 ranks" in err
    fetched = tmp_path / "plan" / "plan.json"
    assert json.loads(fetched.read_text())["plan_id"] == plan_id

    code = main(["train", "--plan-id", "0123456789abcdef", "--out", str(tmp_path), *store.args()])
    err = capfd.readouterr().err
    assert code == 2 and "Cannot find plan 0123456789abcdef" in err and "Traceback" not in err
    # Without --out, a refused training's new out/<plan_id>/train-<time> (its fetched plan) is not left behind.
    (tmp_path / "cwd").mkdir()
    monkeypatch.chdir(tmp_path / "cwd")
    code = main(["train", "--plan-id", plan_id, "--nproc-per-node", "3", *store.args()])
    assert code == 2 and "2 ranks" in capfd.readouterr().err
    assert list((tmp_path / "cwd" / "out" / plan_id).iterdir()) == []


def table_rows(out: str) -> list[dict[str, str]]:
    """The rows of a table the CLI printed, by column name (the rule line gives each column's span)."""
    header, rule, *rows = out.strip().splitlines()
    spans, start = [], 0
    for dashes in rule.split("  "):
        spans.append((start, start + len(dashes)))
        start += len(dashes) + 2
    names = [header[a:b].strip() for a, b in spans]
    return [{n: row[a:b].strip() for n, (a, b) in zip(names, spans, strict=True)}
            for row in rows if row.strip() and not row.startswith("(")]


def test_compare_shows_predicted_and_measured_in_one_row_fitting_the_terminal(first_run, store, capsys,
                                                                             monkeypatch):
    from flows.commands.compare import HEADER

    plan_id = plan_id_of(store)
    monkeypatch.setenv("COLUMNS", "80")
    assert main(["compare", *store.args()]) == 0
    out = capsys.readouterr().out
    assert max(len(line) for line in out.splitlines()) <= 80
    assert "more columns with --wide" in out
    narrow = table_rows(out.split("\n\n")[0])
    assert {"plan_id", "planner", "run", "spec", "topology", "pred_ms", "p50_ms"} <= set(narrow[0])

    assert main(["compare", "--wide", *store.args()]) == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == list(HEADER)
    rows = table_rows(out.split("\n\n")[0])
    trains = [t for t in store.runs("train") if t.info.status in ("FINISHED", "FAILED")]
    assert len(rows) == len(trains) and all(row["plan_id"] == plan_id for row in rows)
    (plan,) = store.runs("plan")
    for row in rows:
        assert (row["spec"], row["topology"], row["profile"]) == ("cpu_demo", "cpu_2proc", "default")
        assert float(row["pred_ms"]) == pytest.approx(plan.data.metrics["critical_path_ms"], rel=1e-3)
    finished = [t for t in trains if t.info.status == "FINISHED"]
    assert sorted((r["p50_ms"], r["batch"], r["iters"]) for r in rows if r["p50_ms"] != "FAILED") == sorted(
        (f"{t.data.metrics['measured_iteration_ms']:.2f}", t.data.params["batch_size"], t.data.params["iterations"])
        for t in finished)
    # Trained at 32 samples per rank, not the 512 the plan predicts for: no ratio is shown.
    assert {r["p50/pred"] for r in rows} == {"-"}

    assert main(["compare", "--spec-hash", "ffffffffffffffff", *store.args()]) == 0
    assert "no plan, train or measure runs" in capsys.readouterr().out
    assert main(["compare", "--last", "0", *store.args()]) == 2


def test_bad_input_to_run_exits_2_with_a_one_screen_message(prefect_api, tmp_path, capfd):
    bad = tmp_path / "bad.yaml"
    bad.write_text("- {name: dup, num_embeddings: 10, embedding_dim: 4}\n"
                   "- {name: dup, num_embeddings: 10, embedding_dim: 4}\n")
    args = ["--out", str(tmp_path / "out"), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}",
            "--state-dir", str(tmp_path / "state")]
    assert main(["run", str(bad), "--topology", str(CPU_2PROC), *args]) == 2
    err = capfd.readouterr().err
    assert "dup" in err and "Traceback" not in err and len(err.splitlines()) < 25

    # Found inside the flow (the search): still one message, no traceback.
    tiny = tmp_path / "tiny.yaml"
    tiny.write_text(CPU_2PROC.read_text().replace("ddr_cap: 16GiB", "ddr_cap: 20MiB"))
    assert main(["run", str(DEMO), "--topology", str(tiny), *args]) == 2
    err = capfd.readouterr().err
    assert "user_id" in err and "Traceback" not in err and len(err.splitlines()) < 30


def test_a_failing_training_leaves_failed_mlflow_runs_with_the_cause_and_is_not_retried_in_vain(
        first_run, store, tmp_path, capfd):
    from mlflow import MlflowClient

    # --model dlrm needs one embedding dim; the demo has three: every rank fails the same way.
    code = main(["run", str(DEMO), "--topology", str(CPU_2PROC), *TINY_TRAINING, "--model", "dlrm",
                 "--train-retries", "2", "--out", str(tmp_path / "out"), *store.args()])
    err = capfd.readouterr().err
    assert code == 2  # a certain failure: the user's to fix
    assert err.count("needs one embedding_dim") == 1 and "Traceback" not in err
    train, pipeline = store.runs("train")[-1], store.runs("pipeline")[-1]
    for run in (train, pipeline):
        assert run.info.status == "FAILED"
        assert "needs one embedding_dim" in run.data.tags["shardflow.error"]
    assert train.data.tags["shardflow.attempts"] == "1"  # not retried
    assert train.data.tags["mlflow.parentRunId"] == pipeline.info.run_id
    logs = {a.path for a in MlflowClient(store.uri).list_artifacts(train.info.run_id, "logs")}
    assert {"logs/rank-0.log", "logs/rank-1.log", "logs/torchrun-node0.log"} <= logs

    assert main(["compare", *store.args()]) == 0
    assert "FAILED" in capfd.readouterr().out


def at_work(process: subprocess.Popen, store: Path) -> None:
    """Until ``process`` has its imports behind it: it has opened the MLflow store (it fetches the
    plan from it next) or started its training."""
    import psutil

    me, store_file = psutil.Process(process.pid), os.path.realpath(store)
    deadline = time.monotonic() + 300
    while process.poll() is None and time.monotonic() < deadline:
        try:
            if me.children() or any(f.path == store_file for f in me.open_files()):
                return
        except psutil.Error:
            return
        time.sleep(0.05)


def test_two_trainings_of_one_plan_id_write_their_own_directories(first_run, store, tmp_path, monkeypatch, capfd):
    """At once: one in a process of its own, the other in this process (the same command), started
    as the first turns to the store."""
    plan_id = plan_id_of(store)
    args = ["train", "--plan-id", plan_id, "--iterations", "4", "--warmup", "1", "--batch-size", "32", *store.args()]
    other = subprocess.Popen([str(SHARDFLOW), *args], cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, env=os.environ)
    try:
        at_work(other, store.root / "mlflow.db")
        monkeypatch.chdir(tmp_path)
        here = main(args)
    finally:
        output = other.communicate(timeout=600)[0]
    assert [other.returncode, here] == [0, 0], output + "\n".join(capfd.readouterr())
    dirs = sorted(p.parent for p in (tmp_path / "out" / plan_id).glob("train-*/train_metrics.json"))
    assert len(dirs) == 2
    for d in dirs:
        assert json.loads((d / "plan" / "plan.json").read_text())["plan_id"] == plan_id
        assert (d / "logs" / "rank-0.log").exists()
    assert (tmp_path / "out" / "latest").resolve() in dirs
    recorded = [t for t in store.runs("train") if t.info.status == "FINISHED" and t.data.params["iterations"] == "4"]
    assert len(recorded) == 2  # standalone training is recorded in MLflow too


@pytest.mark.slow
def test_ctrl_c_during_the_training_of_run_is_one_line_saying_where_to_resume_and_stops_everything(
        tmp_path, prefect_api, mlflow_uri):
    """Ctrl-C at a terminal: SIGINT to the foreground process group (the command, and whatever it
    started in that group). Prefect's crash reports are not the user's news (its own server stays
    out of the group: tests/flows/test_ephemeral_api.py)."""
    import psutil

    from rec.train.resume import latest, step_dir

    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "MLFLOW_"))}
    out = tmp_path / "out"
    run = subprocess.Popen(
        [str(SHARDFLOW), "run", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(out), "--iterations", "1000000",
         "--warmup", "1", "--batch-size", "32", "--checkpoint-every", "5", "--keep-checkpoints", "1",
         "--tracking-uri", mlflow_uri],
        cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
        env={**clean, "PREFECT_API_URL": prefect_api})
    try:
        deadline = time.monotonic() + 300
        while latest(out / "train" / "checkpoints") is None:
            assert run.poll() is None and time.monotonic() < deadline, run.communicate(timeout=30)
            time.sleep(0.2)
        started = psutil.Process(run.pid).children(recursive=True)
        os.killpg(run.pid, signal.SIGINT)
        _, stderr = run.communicate(timeout=120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(run.pid, signal.SIGKILL)
    assert run.returncode == 128 + signal.SIGINT, stderr
    lines = [line for line in stderr.splitlines() if not line.startswith(("Prefect:", "MLflow:", "train:"))]
    assert len(lines) == 1, stderr
    step = latest(out / "train" / "checkpoints")
    assert lines[0].startswith("shardflow run: stopped by SIGINT after ") and "every rank have exited" in lines[0]
    assert f"newest checkpoint {step_dir(out / 'train' / 'checkpoints', step)}" in lines[0]
    assert "the same command with --resume goes on from it" in lines[0]
    assert not any(noise in stderr for noise in ("Crash detected", "Error logging", "failed after", "Traceback"))
    _, alive = psutil.wait_procs(started, timeout=30)
    assert not alive, [p.cmdline() for p in alive]
