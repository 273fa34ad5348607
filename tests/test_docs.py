"""The contracts documented in docs/ name everything the code reads and writes."""

from __future__ import annotations

import dataclasses

from tests.paths import DOCS, ROOT


def doc(name: str) -> str:
    return (DOCS / name).read_text(encoding="utf-8")


def test_the_cli_reference_is_generated_from_the_parser():
    from flows.cli_reference import render

    assert doc("cli.md") == render(), "docs/cli.md is stale: run `make docs`"


def test_every_spec_column_and_topology_key_is_documented():
    from rec.spec.columns import COLUMNS
    from rec.topology.validate import KEYS

    assert [c for c in COLUMNS if f"`{c}`" not in doc("spec.md")] == []
    assert [k for k in KEYS if f"`{k}`" not in doc("topology.md")] == []


def test_every_plan_json_key_and_metric_is_documented():
    from rec.plan.io import SHARD_COLUMNS, plan_to_dict
    from rec.plan.types import PlanMetrics
    from rec.planning import plan_spec
    from rec.spec.synthetic import issue2282_spec
    from rec.topology import topology_from_dict

    plan = plan_spec(issue2282_spec(4), topology_from_dict({"world_size": 2, "compute_device": "cuda"}))
    text = doc("plan-format.md")
    keys = list(plan_to_dict(plan)) + [f.name for f in dataclasses.fields(PlanMetrics)] + list(SHARD_COLUMNS)
    assert [k for k in keys if f"`{k}`" not in text] == []


def test_every_mlflow_tag_param_metric_series_and_artifact_is_documented(tmp_path):
    """Names from the records themselves: a plan run, a replanned plan's run, a train run with its
    series, a measure run, the headline a pipeline run ends with, and the names before 0.2.0 that
    the compatibility switch logs."""
    import re

    import numpy as np

    from rec.plan.io import write_plan
    from rec.planning import plan_spec, replan_spec
    from rec.train.metrics import (
        DataRead,
        Iterations,
        LatencyStats,
        LossStats,
        TrainMetrics,
        read_metrics,
        write_metrics,
    )
    from tasks import records
    from tasks.ingest import ingest
    from tasks.measure_record import measure_record
    from tasks.mlflow_log import ParentRun
    from tasks.train import Trained, TrainSettings

    text = doc("mlflow.md")
    tags = [v for k, v in vars(records).items() if k.isupper() and isinstance(v, str) and v.startswith("shardflow.")]
    names = tags + list(records.PLAN_ARTIFACTS) + list(records.TRAIN_ARTIFACTS)
    inputs = ingest(str(ROOT / "examples/specs/cpu_demo.yaml"), str(ROOT / "examples/topologies/cpu_2proc.yaml"))
    plan = plan_spec(inputs.spec, inputs.topology)
    replanned = replan_spec(inputs.spec, inputs.topology, plan).plan
    for p in (plan, replanned):
        record = records.plan_record(p, inputs, planning_s=0.1)
        names += list(record.params) + list(record.metrics)

    plan_path = write_plan(plan, tmp_path / "plan")
    stats = LatencyStats(2.0, 3.0, 4.0, 2.5)
    metrics = TrainMetrics(plan.plan_id, 2, 4, 1, 32, "sparse_dist", "concat", stats, LossStats(0.7, 0.5, 0.6),
                           1000.0, {}, 0, predicted_critical_path_ms=plan.metrics.critical_path,
                           data_wait_ms=stats, data=DataRead("train.parquet", 100, 1, 0.5, "error", True, 0),
                           eval={"samples": 10, "auc": 0.7, "logloss": 0.5, "ne": 0.9},
                           evaluations=({"iteration": 4, "samples": 10, "auc": 0.7, "logloss": 0.5, "ne": 0.9},))
    write_metrics(tmp_path / "train", metrics, Iterations.of_run(0, np.ones(4), np.ones(4), 1))
    trained = Trained(plan.plan_id, str(tmp_path / "train"), read_metrics(tmp_path / "train"), TrainSettings(), 2, 1, 0,
                      str(plan_path))
    record = records.train_record(trained, inputs=inputs)
    assert record.metrics[records.PREDICTED] == plan.metrics.critical_path  # TorchRec's default profile
    names += list(record.params) + list(record.metrics) + list(record.series)
    # A measure run's own names are in measure.md, per rank as `measured_ms_rank<R>`.
    measure_text = text + doc("measure.md")
    measured = {re.sub(r"rank\d+$", "rank<R>", n) for n in measure_record(_measured(plan_path, tmp_path / "m")).metrics}
    assert sorted(n for n in measured if f"`{n}`" not in measure_text) == []
    parent = ParentRun("0" * 32, plan.plan_id)
    parent.add_plan(plan)
    parent.add_training(trained)
    names += list(parent.params) + list(parent.metrics)
    names += [records.LEGACY_NAMES_ENV, *records.LEGACY_PLAN, *records.LEGACY_TRAIN, *records.LEGACY_MEASURE,
              records.LEGACY_LATENCY_SERIES, records.LEGACY_MEASURED_SERIES, records.LEGACY_LOSS_SERIES]
    assert sorted({n for n in names if f"`{n}`" not in text}) == []


def _measured(plan_path, out):
    """A measurement of the plan at ``plan_path`` as node 0 of ``shardflow measure`` returns it."""
    from rec.plan import read_plan
    from rec.profile.types import Machine
    from rec.sharding import ComputeDevice
    from rec.train.measure_report import measure_report
    from rec.train.timings import PlanTimes, Status
    from tasks.measure import Measured, MeasureSettings

    plan = read_plan(plan_path)
    times = PlanTimes(plan_path=str(plan_path), plan_id=plan.plan_id, status=Status.MEASURED, warmup=1,
                      fwd_ms=((1.0, 1.0), (2.0, 2.0)), bwd_ms=((1.0, 1.0), (2.0, 2.0)))
    report = measure_report(plan, times, Machine(ComputeDevice.CPU))
    return Measured(plan.plan_id, str(out), report, MeasureSettings(), 2, 0, str(plan_path))


def _enum_docs() -> list[tuple[str, str, str, set[str], set[str]]]:
    """(what, doc, where the values are listed: a regex whose groups hold them, the values the code
    has, other names allowed there) for every enum whose values reach a file, a flag or MLflow."""
    from rec.config.cost import Optimizer
    from rec.config.planner_identity import Planner
    from rec.search.bound import BoundMethod
    from rec.sharding import (
        NOT_PLANNED,
        ComputeDevice,
        ComputeKernel,
        DataType,
        ModuleKind,
        Pooling,
        ShardingType,
        offered,
    )
    from rec.train.config import ModelKind, PipelineKind
    from rec.train.timings import Status
    from tasks.records import RunStatus, RunStep
    from tasks.search import Backend

    def values(enum, leave_out=()) -> set[str]:
        return {m.value for m in enum if m not in leave_out}

    sharding, kernels = values(ShardingType, NOT_PLANNED), values(ComputeKernel, NOT_PLANNED)
    ec_sharding = {st.value for st in offered(ModuleKind.EMBEDDING_COLLECTION)[0]}
    return [
        ("metrics.bound_method", "plan-format.md", r"\| `bound_method` \|(.*)", values(BoundMethod),
         {"lower_bound", "unknown"}),
        ("sharding_type", "plan-format.md", r"\| `sharding_type` \|(.*)", sharding, set()),
        ("compute_kernel", "plan-format.md", r"\| `compute_kernel` \|(.*)", kernels, set()),
        ("planner.cost.optimizer", "plan-format.md", r"\| `planner.cost.optimizer` \|(.*)", values(Optimizer), set()),
        ("planner.backend", "plan-format.md", r"\| `planner.backend` \|(.*)", values(Backend, {Backend.LOCAL}),
         {"backend"}),
        ("planner.made_by.name", "plan-format.md", r"\| `planner.made_by.name` \|(.*)",
         values(Planner, {Planner.SHARDFLOW}), {"made_by"}),
        ("spec pooling", "spec.md", r"\| `pooling` \|(.*)", values(Pooling),
         {"EmbeddingCollection", "EmbeddingBagCollection"}),
        ("spec data_type", "spec.md", r"\| `data_type` \|(.*)", values(DataType), set()),
        ("spec sharding_types", "spec.md", r"\| `sharding_types` \|(.*)", sharding, set()),
        ("spec compute_kernels", "spec.md", r"\| `compute_kernels` \|(.*)", kernels, set()),
        ("an EmbeddingCollection's sharding types", "spec.md", r"\(`EmbeddingCollectionSharder`: ([^)]*)\)",
         ec_sharding, set()),
        ("module kinds", "spec.md", r"A module's tables decide its kind: ([^.]*)\.", values(ModuleKind),
         values(Pooling)),
        ("topology compute_device", "topology.md", r"\| `compute_device` \|(.*)", values(ComputeDevice), set()),
        ("profile device", "profile.md", r"\| `device` \|(.*)", values(ComputeDevice), set()),
        ("--model", "training.md", r"^(`--model [a-z_|]*`)", values(ModelKind), {"--model"}),
        ("train_metrics.json pipeline", "training.md", r"^`pipeline` \(([^)]*)\)", values(PipelineKind), set()),
        ("timings.json status", "measure.md", r"`status` \(((?:`[^`]*`, )+or `[^`]*`)", values(Status), set()),
        ("MLflow shardflow.step", "mlflow.md", r"^\| \w+ \| (`\w+`) \|", values(RunStep), set()),
        ("MLflow run statuses", "mlflow.md", r"^Run statuses \(MLflow's\): (.*)", values(RunStatus), set()),
        ("MLflow plan run backend", "mlflow.md", r"`backend` \(([^)]*)\)", values(Backend), set()),
        ("MLflow planner param", "mlflow.md", r"^\| `planner` \|(.*)", values(Planner), set()),
        ("MLflow plan run optimizer", "mlflow.md", r"`optimizer` \(([^)]*)\)", values(Optimizer), set()),
        ("MLflow plan run bound_method", "mlflow.md", r"`bound_method` \(([^)]*)\)", values(BoundMethod), set()),
        ("MLflow plan run compute_device", "mlflow.md", r"`compute_device` \(([^)]*)\)", values(ComputeDevice),
         set()),
        ("MLflow train run pipeline", "mlflow.md", r"`pipeline` \(([^)]*)\)", values(PipelineKind), set()),
    ]


def _listed(text: str, pattern: str) -> set[str]:
    """The names in backquotes (split at ``|`` and spaces) inside every match of ``pattern``'s groups."""
    import re

    found = [g for m in re.finditer(pattern, text, re.MULTILINE) for g in m.groups()]
    assert found, f"no match for {pattern!r}"
    return {name for group in found for span in re.findall(r"`([^`]*)`", group)
            for name in re.split(r"[|\s]+", span) if name}


def test_every_enum_valued_field_documents_exactly_the_values_of_the_code():
    """A value the code writes but the docs leave out, or one the docs list that the code never
    writes (`lp` for `lagrangian`), fails here; flags' choices are in docs/cli.md, generated."""
    wrong = []
    for what, name, pattern, code, others in _enum_docs():
        listed = _listed(doc(name), pattern) - others
        if listed != code:
            wrong.append(f"{name}, {what}: documents {sorted(listed - code)} not in the code, "
                         f"leaves out {sorted(code - listed)}")
    assert wrong == []


def test_the_readme_says_which_training_loop_auto_runs_where_as_the_code_picks_it():
    from rec.train.config import PipelineKind

    readme = " ".join((ROOT / "README.md").read_text().split())
    assert ("`--pipeline auto`: TorchRec's `TrainPipelineSparseDist` on several GPUs, a plain loop on one GPU "
            "and on cpu") in readme
    picks = {(world, device): PipelineKind.AUTO.on(world, device) for world, device in
             ((8, "cuda"), (2, "cuda"), (1, "cuda"), (2, "cpu"), (1, "cpu"))}
    assert picks == {(8, "cuda"): PipelineKind.SPARSE_DIST, (2, "cuda"): PipelineKind.SPARSE_DIST,
                     (1, "cuda"): PipelineKind.NAIVE, (2, "cpu"): PipelineKind.NAIVE, (1, "cpu"): PipelineKind.NAIVE}


def test_the_spec_formats_the_help_names_are_those_the_reader_reads():
    from flows.commands.plan import SPEC_FILES
    from rec.spec.read import FORMATS

    assert SPEC_FILES.split() == list(FORMATS)
