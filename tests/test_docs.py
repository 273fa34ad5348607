"""The contracts documented in docs/ name everything the code reads and writes."""

from __future__ import annotations

import dataclasses
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


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


def test_every_mlflow_tag_param_metric_and_artifact_is_documented():
    from rec.planning import plan_spec
    from tasks import records
    from tasks.ingest import ingest

    text = doc("mlflow.md")
    tags = [v for k, v in vars(records).items() if k.isupper() and isinstance(v, str) and v.startswith("shardflow.")]
    names = tags + list(records.PLAN_ARTIFACTS) + list(records.TRAIN_ARTIFACTS)
    inputs = ingest(str(ROOT / "examples/specs/cpu_demo.yaml"), str(ROOT / "examples/topologies/cpu_2proc.yaml"))
    record = records.plan_record(plan_spec(inputs.spec, inputs.topology), inputs, planning_s=0.1)
    names += list(record.params) + list(record.metrics)
    assert [n for n in names if f"`{n}`" not in text] == []
