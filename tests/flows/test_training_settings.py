"""A training setting travels whole and by its own name: the CLI builds ``TrainSettings`` once and
the pipeline takes it as its ``training`` parameter; a deployment names the field
(``training.job.NAME``) and Prefect's parameter schema lists it; the training job gets it on its
command line. Every field of ``TrainConfig`` is tried, so one added later is tried too: it needs
no edit outside ``TrainConfig`` (``SAMPLES`` only if no value of its type passes the checks)."""

from __future__ import annotations

import contextlib
import dataclasses
import types
import typing
from enum import Enum
from typing import Any

import pytest
import yaml

from flows.cli import main
from rec.settings import to_dict, to_flags
from rec.train.config import ModelKind, TrainConfig
from tasks.train import TrainSettings
from tests.paths import CPU_2PROC, DEMO

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")  # SQLAlchemy, from MLflow+Prefect

FIELDS = {f.name: f for f in dataclasses.fields(TrainConfig)}
SAMPLES: dict[str, Any] = {"model": ModelKind.CONCAT.value}  # a text the job's own checks accept
WITH: dict[str, dict[str, Any]] = {"eval_every": {"eval_data": "some/where"}}  # what a setting needs beside it
FLOWS = {"pipeline": "flows.pipeline.pipeline_flow", "train": "flows.train.train_flow"}


def other_value(name: str) -> Any:
    """A value of ``TrainConfig.<name>`` other than its default that passes the settings' checks."""
    if name in SAMPLES:
        return SAMPLES[name]
    f, tp = FIELDS[name], typing.get_type_hints(TrainConfig)[name]
    default: Any = f.default
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        (tp,) = [a for a in typing.get_args(tp) if a is not type(None)]
    if tp is bool:
        return not default
    if isinstance(tp, type) and issubclass(tp, Enum):
        return next(m for m in tp if m != default)
    if tp is int:
        value = (default if default is not None else f.metadata["minimum"] or 0) + 1
        return value if f.metadata["maximum"] is None else min(value, f.metadata["maximum"])
    if tp is float:
        return default + 0.5
    if typing.get_origin(tp) is tuple:
        return (2, *default)
    if tp is str:
        return "some/where"
    raise AssertionError(f"no sample value for TrainConfig.{name} ({tp}): add one to SAMPLES")


def plain(name: str, value: Any) -> Any:
    """``value`` as a deployment file or ``--set`` writes it (YAML: enums by value, lists)."""
    return to_dict(dataclasses.replace(TrainConfig(), **{name: value}))[name]


def job_gets(job: TrainConfig) -> TrainConfig:
    """What the training job makes of the command line torchrun starts it with."""
    from rec.train.job import parse_args
    from tasks.launch import TRAIN_JOB, Launch, torchrun_command

    command = torchrun_command(Launch("plan.json", "out", 2, job=job))
    return parse_args(command[command.index(TRAIN_JOB) + 1:])[1]


def test_paths_starting_with_a_dash_reach_the_ranks_as_paths_not_flags():
    """``--out ./-t`` (``-t`` once normalized), ``--checkpoint-dir ./-ck``: the ranks' argparse read them
    as flags and every rank exited with code 2 after the launch ("without a Python error")."""
    import os

    from rec.train.job import parse_args
    from tasks.launch import TRAIN_JOB, Launch, torchrun_command

    job = dataclasses.replace(TrainConfig(), checkpoint_dir="-ck", resume_from="-old/checkpoints", data="-data.parquet")
    command = torchrun_command(Launch("-plan/plan.json", "-t", 2, job=job, more_flags=("--plan-id=-1",)))
    args, got = parse_args(command[command.index(TRAIN_JOB) + 1:])
    assert (args.plan, args.out, args.plan_id) == (os.path.abspath("-plan/plan.json"), "-t", "-1")
    assert (got.checkpoint_dir, got.resume_from, got.data) == ("-ck", "-old/checkpoints", "-data.parquet")


def test_torchruns_environment_defaults_from_an_outer_launcher_do_not_change_the_launch(monkeypatch):
    """Kubeflow's training operator sets PET_NNODES (torchrun's default for --nnodes) in every pod: a
    one-node `shardflow train` there waited for a second node that never came, saying nothing."""
    from torch.distributed.run import parse_args

    from rec.train.lifetime import LAUNCHER_MODULE
    from tasks.launch import Launch, job_environment, torchrun_command

    monkeypatch.setenv("PET_NNODES", "2")
    monkeypatch.setenv("PET_MAX_RESTARTS", "5")
    assert not [name for name in job_environment() if name.startswith("PET_")]
    command = torchrun_command(Launch("plan.json", "out", 2))
    args = parse_args(command[command.index(LAUNCHER_MODULE) + 1:])  # as torch reads them, PET_NNODES=2 still set

    assert (args.nnodes, args.max_restarts, args.standalone) == ("1", 0, True)


@pytest.mark.parametrize("flow_name", FLOWS)
def test_the_flows_parameter_schema_lists_every_training_setting(flow_name):
    from flows.deployments import load_flow

    schema = load_flow(FLOWS[flow_name]).parameters.model_dump()
    assert schema["properties"]["training"]["$ref"] == "#/definitions/TrainSettings"
    assert schema["properties"]["training"]["default"] == to_dict(TrainSettings())
    settings, job = schema["definitions"]["TrainSettings"], schema["definitions"]["TrainConfig"]
    assert set(settings["properties"]) == {f.name for f in dataclasses.fields(TrainSettings)}
    assert settings["properties"]["job"]["$ref"] == "#/definitions/TrainConfig"
    assert set(job["properties"]) == set(FIELDS)


def test_a_deployment_sets_every_training_setting_by_its_name_and_the_job_gets_it(tmp_path, monkeypatch):
    """In the deployment file and with ``serve --set training.job.NAME=VALUE``; a path setting
    resolves against the file's directory, or the working directory for ``--set``."""
    from flows.deployments import load_flow, runner_deployments
    from rec.settings import is_path

    # serving refuses settings every run would refuse: --resume-from beside --resume goes apart
    for chosen in (set(FIELDS) - {"resume_from"}, {"resume_from"}):
        values = {name: other_value(name) for name in FIELDS if name in chosen}
        written = {name: plain(name, value) for name, value in values.items()}
        deploy, elsewhere = tmp_path / f"deploy{len(chosen)}", tmp_path / f"elsewhere{len(chosen)}"
        deploy.mkdir()
        elsewhere.mkdir()
        inputs = {"pipeline": {"spec_path": str(DEMO), "topology_path": str(CPU_2PROC)},
                  "train": {"plan_path": "plan.json"}}
        for file, training in [("prefect.yaml", {"training": {"job": written}}), ("plain.yaml", {})]:
            (deploy / file).write_text(yaml.safe_dump({"deployments": [
                {"name": flow_name, "entrypoint": entrypoint, "parameters": {**inputs[flow_name], **training}}
                for flow_name, entrypoint in FLOWS.items()]}))
        monkeypatch.chdir(elsewhere)

        for prefect_file, overrides, base in [
                ("prefect.yaml", {}, deploy),
                ("plain.yaml", {f"training.job.{name}": value for name, value in written.items()}, elsewhere)]:
            job = TrainConfig(**{name: str(base / value) if is_path(FIELDS[name]) else value
                                 for name, value in values.items()})
            for deployment in runner_deployments(deploy / prefect_file, overrides=overrides):
                training = load_flow(FLOWS[deployment.name]).validate_parameters(deployment.parameters)["training"]
                assert training == TrainSettings(job=job), deployment.name
                assert job_gets(training.job) == job


@pytest.mark.parametrize("name", FIELDS)
def test_the_cli_builds_the_training_settings_once_and_the_pipeline_takes_them_whole(name, monkeypatch):
    training = TrainSettings(job=dataclasses.replace(TrainConfig(), **{name: other_value(name)}, **WITH.get(name, {})))
    handed = run_handing_over(monkeypatch, to_flags(training.job))
    assert handed["training"] == training
    assert not set(handed) & set(FIELDS)  # no setting goes by a second name


def test_the_cli_builds_the_search_and_tracking_settings_and_the_pipeline_takes_them_whole(monkeypatch, tmp_path):
    from rec.settings import from_dict
    from tasks.search import SearchSettings
    from tasks.tracking import TrackingSettings

    handed = run_handing_over(monkeypatch, [
        "--backend", "ray", "--groups", "3", "--max-regress", "0.5", "--time-limit", "2",
        "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", "--experiment", "e", "--state-dir", str(tmp_path)])
    searching = from_dict(SearchSettings, {"backend": "ray", "groups": 3, "max_regress": 0.5,
                                           "config": {"time_limit_s": 2.0}})
    assert handed["searching"] == searching
    assert handed["tracking"] == TrackingSettings(f"sqlite:///{tmp_path / 'm.db'}", "e", str(tmp_path))


def test_run_reads_validates_and_hashes_the_spec_once(monkeypatch):
    import tasks.ingest

    read = []
    real = tasks.ingest.read_spec
    monkeypatch.setattr(tasks.ingest, "read_spec", lambda path: read.append(path) or real(path))
    handed = run_handing_over(monkeypatch, ["--train-iterations", "50"], ingest_in_flow=True)
    assert handed["training"].job.iterations == 50  # the flag's first name still works
    assert read == [str(DEMO)]  # the CLI's check read it and handed it to the flow


class HandedOver(Exception):
    """The pipeline flow was called: the test stops there."""


def run_handing_over(monkeypatch, flags: list[str], ingest_in_flow: bool = False) -> dict[str, Any]:
    """``shardflow run DEMO ... FLAGS`` up to the pipeline flow (no Prefect, no training); the
    parameters the flow was given. Preflight's checks of this machine are skipped."""
    import flows.ephemeral_api
    import flows.pipeline
    import tasks.measure
    import tasks.train
    from flows.start import inputs_for

    # tasks.measure binds tasks.train.preflight when first imported (which `run` may do): imported
    # before the patch, or it keeps the patched one for every later test in this worker.
    assert vars(tasks.measure)["preflight"] is tasks.train.preflight

    handed: dict[str, Any] = {}

    def pipeline_flow(spec_path: str, topology_path: str, **parameters: Any) -> None:
        handed.update(parameters)
        if ingest_in_flow:
            inputs_for(spec_path, topology_path, parameters["ingested"])  # what the flow's step 1 does
        raise HandedOver

    monkeypatch.setattr(flows.pipeline, "pipeline_flow", pipeline_flow)
    monkeypatch.setattr(flows.ephemeral_api, "ephemeral_api", lambda meanwhile=(): contextlib.nullcontext())
    monkeypatch.setattr(tasks.train, "preflight", lambda *args, **kwargs: 2)
    with pytest.raises(HandedOver):
        main(["run", str(DEMO), "--topology", str(CPU_2PROC), *flags])
    return handed


def test_a_flow_takes_the_inputs_its_caller_ingested_and_prefect_records_none_of_their_tables(
        prefect_api, tmp_path, monkeypatch, mlflow_uri):
    """Through Prefect's real flow run: the flow plans what it was handed (the files are not read
    again), and the flow run's parameters, which Prefect stores, hold ``<Ingested>``, not the spec
    (``flows.start.Ingested``), beside the settings the flow took whole."""
    from prefect import get_client

    import tasks.ingest
    from flows.plan import plan_flow
    from flows.start import Ingested
    from rec.settings import to_dict
    from tasks.ingest import ingest
    from tasks.search import SearchSettings
    from tasks.tracking import TrackingSettings

    inputs = ingest(str(DEMO), str(CPU_2PROC))
    monkeypatch.setattr(tasks.ingest, "read_spec", lambda path: pytest.fail(f"read {path} again"))
    tracking = TrackingSettings(mlflow_uri, state_dir=str(tmp_path / "state"))
    state = plan_flow(str(DEMO), str(CPU_2PROC), searching=SearchSettings(max_regress=0.5), chart=False,
                      out_dir=str(tmp_path / "out"), tracking=tracking, ingested=Ingested(inputs),
                      return_state=True)
    assert state.result().plan_id
    with get_client(sync_client=True) as client:
        recorded = client.read_flow_run(state.state_details.flow_run_id).parameters
    assert recorded["ingested"] == "<Ingested>"
    assert recorded["tracking"] == to_dict(tracking)
    assert recorded["searching"]["max_regress"] == 0.5


def test_a_deployment_that_names_a_parameter_its_flow_does_not_have_is_refused_before_serving(tmp_path):
    """The flat training names of the first flows (``train_iterations``) are gone: a deployment
    that still gives one is named when serving starts, not in a failed flow run later."""
    from flows.deployments import runner_deployments
    from rec.errors import InputError

    (tmp_path / "prefect.yaml").write_text(yaml.safe_dump({"deployments": [{
        "name": "pipeline", "entrypoint": FLOWS["pipeline"],
        "parameters": {"spec_path": str(DEMO), "topology_path": str(CPU_2PROC), "train_iterations": 7}}]}))
    with pytest.raises(InputError) as refused:
        runner_deployments(tmp_path / "prefect.yaml")
    ((where, reason),) = [(p.where, p.reason) for p in refused.value.problems]
    assert where.endswith(": pipeline: train_iterations")
    assert reason.startswith("shardflow-pipeline has no such parameter") and "'training'" in reason


def test_serve_sets_one_setting_and_keeps_the_deployments_others_or_names_one_no_flow_has(tmp_path):
    from flows.deployments import runner_deployments
    from rec.errors import InputError

    (tmp_path / "prefect.yaml").write_text(yaml.safe_dump({"deployments": [{
        "name": "train", "entrypoint": FLOWS["train"],
        "parameters": {"plan_path": "plan.json", "training": {"job": {"warmup": 2}, "nnodes": 1}}}]}))
    (deployment,) = runner_deployments(tmp_path / "prefect.yaml", overrides={"training.job.iterations": 5})
    assert deployment.parameters["training"] == {"job": {"warmup": 2, "iterations": 5}, "nnodes": 1}
    with pytest.raises(InputError) as refused:
        runner_deployments(tmp_path / "prefect.yaml", overrides={"training.job.iteratons": 5})
    assert [(p.where, p.reason) for p in refused.value.problems] == [
        ("--set training.job.iteratons", "training has no setting job.iteratons")]


def test_the_ranks_train_only_the_plan_the_launcher_checked(tmp_path, capsys, monkeypatch):
    """Another command that wrote a plan into the same path after the launcher's checks (two runs
    sharing an --out) had the ranks train that plan, and MLflow record the first one's plan_id."""

    from torchrec.distributed.planner import EmbeddingShardingPlanner

    from rec.exit_codes import ExitCode
    from rec.plan import write_plan
    from rec.planning import plan_spec
    from rec.spec import read_spec
    from rec.topology import read_topology
    from rec.train import job
    from tasks.launch import torchrun_command
    from tasks.train import prepare

    spec, topology = read_spec(DEMO), read_topology(CPU_2PROC)
    checked = plan_spec(spec, topology)
    write_plan(checked, tmp_path / "plan")
    _, launch = prepare(str(tmp_path / "plan"), str(tmp_path / "out"), TrainSettings())
    command = torchrun_command(launch)
    assert f"--plan-id={checked.plan_id}" in command
    other = tmp_path / "other.yaml"
    other.write_text(CPU_2PROC.read_text().replace("batch_size:", "batch_size: 64 #"))
    write_plan(plan_spec(spec, read_topology(other)), tmp_path / "plan")  # written there since
    for name in ("plan", "collective_plan"):  # a rank refuses TorchRec's planner: for this process, not for long
        monkeypatch.setattr(EmbeddingShardingPlanner, name, getattr(EmbeddingShardingPlanner, name))
    code = job.main(["--plan", str(tmp_path / "plan"), "--out", str(tmp_path / "out"), "--plan-id", checked.plan_id])
    err = capsys.readouterr().err
    assert code == ExitCode.BAD_INPUT and "The plan changed after the launcher checked it" in err, err
    assert f"not plan {checked.plan_id}" in err and "Traceback" not in err
