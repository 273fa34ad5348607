"""Hardware profiles: the YAML form, validation, hashing, the device check, and what plans record.

The oracle tests (per-shard perf under a profile = TorchRec's under an equivalent HardwarePerfConfig)
are in test_cost.py; here the default profile is shown to leave the plans and plan_ids of the
bundled examples exactly as the code before profiles made them.
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import fields, replace
from pathlib import Path

import numpy as np
import pytest

from flows.cli import main
from rec.analysis import check_plan
from rec.config.cost import CostConfig
from rec.config.search import SearchConfig
from rec.cost import enumerate_options
from rec.cost.bandwidth import kernel_bw, links
from rec.cost.perf import shard_perf
from rec.errors import InputError
from rec.plan import read_plan
from rec.plan.breakdown import breakdown
from rec.plan.io import dumps_plan
from rec.plan.plan_id import planner_config
from rec.plan.plan_json import planner_to_dict
from rec.planning import plan_spec
from rec.profile import (
    DEFAULT_PROFILE,
    Profile,
    dumps_profile,
    profile_from_dict,
    profile_hash,
    profile_to_dict,
    read_profile,
)
from rec.profile import types as profile_types
from rec.profile.validate import KEYS, PROFILE_FORMAT
from rec.sharding import ComputeKernel, ShardingType
from rec.spec import read_spec
from rec.spec.synthetic import criteo_1tb_spec, issue2282_spec, mixed_spec, power_law_spec
from rec.topology import read_topology
from tests.paths import CPU_2PROC, DEMO, EXAMPLES, H100_2X8, ROOT

SAMPLE = EXAMPLES / "profiles" / "h100_sxm_datasheet.yaml"
SCREEN_LINES = 40

CPU_PROFILE = """\
name: cpu-loopback
bandwidths: {ddr_mem_bw: 20GB/s, intra_host_bw: 1.5GB/s, inter_host_bw: 1GB/s}
kernel_bandwidths: {dense: 8GB/s}
coefficients:
  bwd_compute_multiplier: 3.0
  weighted_feature_bwd_compute_multiplier: 1.25
  weighted_kernel_multiplier: 0.9
  table_wise: {fwd: {lookup_size_multiplier: 1.5, fixed_ms: 0.02}}
  data_parallel: {fwd: {input_read_size_multiplier: 2.0}, bwd: {lookup_size_multiplier: 4.0}}
extensions: {intra_host_latency_ms: 0.05, inter_host_latency_ms: 0.2}
machine:
  device: cpu
  device_name: test cpu
  torch_version: '2.13.0'
  world_size: 2
  local_world_size: 2
  measured_at: 2025-06-01T12:00:00Z
"""


def write(tmp_path: Path, text: str, name: str = "profile.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# ---------------------------------------------------------------- the default changes nothing

# Recorded from the code at a703770 (before profiles): plan_id and sha256 of plan.json (first 16 digits).
PLANS_BEFORE = [
    # Since the exact stage also runs on a model this small within 1% of its bound (rec.search.exact):
    # the same plan, its bound now the MILP's (proven optimal; 0.45% below it before).
    ("cpu_demo", "cpu_2proc", "5e1e111ad8e76c0f", "3d54dfcf8aa44542"),
    ("cpu_demo", "h100_1x8", "b0f4e5bb2b72c14d", "340d882ca35ea66e"),
    ("cpu_demo", "h100_2x8", "48948f2c5702b1d3", "0e6f11962382d6b1"),
    # Since HiGHS runs without restarts (rec.search.milp): another optimal plan, critical path 0.0657158 either way.
    ("criteo_1tb", "h100_1x8", "494a699031ae6121", "6e6832705467b1c1"),
    ("criteo_1tb", "h100_2x8", "3a59ab88008c96d7", "e5e1602f3d833dde"),
    ("mixed_0", "h100_1x8", "6ad96b5297a4eca2", "43dc9be7bab50f98"),
    # Since a plan within 1% of its bound whose model is too large for the exact stage there gets a
    # last look (rec.planning): faster plans (6.8475 → 6.8421 ms, 1.3040 → 1.3022, 3.2557 → 3.2405).
    ("mixed_0", "h100_2x8", "7738361800395c64", "8fbe0ac6d5bff022"),
    ("power_law_60", "cpu_2proc", "de4fd29c42481dc3", "ad25b481b4db5405"),
    ("power_law_60", "h100_1x8", "fd324426c7815eb3", "c3387f354406195d"),
    ("power_law_60", "h100_2x8", "8e816f66ddc01aef", "a8b69b9146f55be3"),
    ("issue2282_200", "cpu_2proc", "e55053e6b79ff980", "1d3e7fb978993334"),
    ("issue2282_200", "h100_1x8", "a401fe3754bc23f8", "4635781031dbcd7d"),
    ("issue2282_200", "h100_2x8", "5a070b7a9eba48e6", "6054554f3c2c4f62"),
]
# sha256 (16 digits) of every option's perf, hbm and ddr arrays, default CostConfig, from a703770.
OPTIONS_BEFORE = [
    ("mixed_0", "cpu_2proc", "f1ce569cae16fe02"),
    ("mixed_0", "h100_1x8", "87860274c745e5c4"),
    ("mixed_0", "h100_2x8", "3d17688b8a53ee9e"),
    ("power_law_60", "cpu_2proc", "83b2396e32dba596"),
    ("power_law_60", "h100_1x8", "11ea7693f01c2968"),
    ("power_law_60", "h100_2x8", "60cbfdb9d221b953"),
    ("criteo_1tb", "cpu_2proc", "5e39cc99a37061cd"),
    ("criteo_1tb", "h100_1x8", "867dd488acfa7c4a"),
    ("criteo_1tb", "h100_2x8", "d6649c44411581eb"),
]
SPECS = {
    "cpu_demo": lambda: read_spec(EXAMPLES / "specs" / "cpu_demo.yaml"),
    "criteo_1tb": lambda: read_spec(EXAMPLES / "specs" / "criteo_1tb.yaml"),
    "mixed_0": lambda: mixed_spec(0),
    "power_law_60": lambda: power_law_spec(60),
    "issue2282_200": lambda: issue2282_spec(200),
}


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:16]


@pytest.mark.parametrize("spec_name, topology_name, plan_id, plan_sha", PLANS_BEFORE)
def test_default_profile_leaves_plans_and_plan_ids_byte_identical(spec_name, topology_name, plan_id, plan_sha,
                                                                 tmp_path):
    spec, topology = SPECS[spec_name](), read_topology(EXAMPLES / "topologies" / f"{topology_name}.yaml")
    for cost in (CostConfig(), CostConfig(profile=read_profile(write(tmp_path, "{}")))):
        plan = plan_spec(spec, topology, cost)
        assert (plan.plan_id, digest(dumps_plan(plan).encode())) == (plan_id, plan_sha)


@pytest.mark.parametrize("spec_name, topology_name, options_sha", OPTIONS_BEFORE)
def test_default_profile_leaves_every_estimate_bit_identical(spec_name, topology_name, options_sha):
    spec = criteo_1tb_spec() if spec_name == "criteo_1tb" else SPECS[spec_name]()
    o = enumerate_options(spec, read_topology(EXAMPLES / "topologies" / f"{topology_name}.yaml"))
    assert digest(o.perf.tobytes() + o.hbm.tobytes() + o.ddr.tobytes()) == options_sha


def test_cli_plan_with_a_profile_of_defaults_writes_the_same_files_as_without(tmp_path, capsys):
    defaults = write(tmp_path, "# TorchRec's numbers, spelled out\ncoefficients:\n  bwd_compute_multiplier: 2\n"
                               "  table_wise: {fwd: {lookup_size_multiplier: 1.0}}\n")
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "a")]) == 0
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--profile", str(defaults),
                 "--out", str(tmp_path / "b")]) == 0
    for name in ("plan.json", "shards.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes(), name
    assert "TorchRec's defaults" in capsys.readouterr().out


# ---------------------------------------------------------------- a profile changes the plan, and the plan says so


def test_a_profile_changes_estimates_plan_id_and_plan_json_records_it(tmp_path, capsys):
    profile_path = write(tmp_path, CPU_PROFILE)
    out = tmp_path / "plan"
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--profile", str(profile_path),
                 "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    profile = read_profile(profile_path)
    assert f"profile:       cpu-loopback (hash {profile_hash(profile)})" in printed
    assert "measured on cpu, 2 ranks" in printed

    payload = json.loads((out / "plan.json").read_text())
    record = payload["planner"]["profile"]
    assert record["hash"] == profile_hash(profile) and record["name"] == "cpu-loopback"
    assert record["machine"]["device"] == "cpu" and record["bandwidths"]["intra_host_bw"] == 1.5e9
    assert "profile" not in payload["planner"]["cost"]
    assert payload["plan_id"] != "5e1e111ad8e76c0f"  # the same inputs without the profile

    plan = read_plan(out)
    check_plan(plan)  # its content gives its plan_id, profile included
    # Estimates are those of the profile: 20 GB/s DDR, a 0.02 ms fixed term on every table_wise lookup.
    spec, topology = read_spec(DEMO), read_topology(CPU_2PROC)
    expected = plan_spec(spec, topology, CostConfig(profile=profile))
    assert plan.plan_id == expected.plan_id and plan.metrics.critical_path == expected.metrics.critical_path
    assert plan.metrics.critical_path != plan_spec(spec, topology).metrics.critical_path

    parts = breakdown(plan)  # shardflow show: compute + comms add up to the plan's per-rank estimate
    np.testing.assert_allclose(parts.rank_compute() + parts.rank_comm(), plan.metrics.rank_perf, rtol=1e-12)
    assert (parts.rank_comm() > 0).all()


def test_an_edited_profile_record_is_refused_when_the_plan_is_read(tmp_path):
    out = tmp_path / "plan"
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--profile", str(write(tmp_path,
                                                                                                       CPU_PROFILE)),
                 "--out", str(out)]) == 0
    text = (out / "plan.json").read_text()
    edited = text.replace('"ddr_mem_bw":20000000000.0', '"ddr_mem_bw":40000000000.0')
    assert edited != text
    (out / "plan.json").write_text(edited)
    with pytest.raises(InputError, match="edited"):
        check_plan(read_plan(out))


def test_plan_cache_key_covers_the_profile():
    cost = CostConfig(profile=profile_from_dict({"coefficients": {"bwd_compute_multiplier": 3}}))
    default, other = (planner_to_dict(planner_config(c, SearchConfig())) for c in (CostConfig(), cost))
    assert "profile" not in default and other["profile"]["hash"] == profile_hash(cost.profile)
    assert {k: v for k, v in other.items() if k != "profile"} == default


# ---------------------------------------------------------------- bad profiles: one screen, exit 2, nothing written


BAD_PROFILES = [
    ("unknown keys and bad numbers", "bandwith: {}\nbandwidths: {hbm_mem_bw: -3GB/s, intra_host_bw: fast}\n"
     "coefficients: {table_wise: {fwd: {lookup_size_multiplier: -1, fixed_ms: .nan}}, row_wize: {}, "
     "weighted_kernel_multiplier: 2e7}\n"
     "extensions: {intra_host_latency_ms: '1ms'}\n",
     ["bandwith: unknown key; did you mean 'bandwidths'?", "bandwidths.hbm_mem_bw", "bandwidths.intra_host_bw",
      "coefficients.table_wise.fwd.lookup_size_multiplier: must be between 0 and", "fixed_ms: expected a finite",
      "row_wize: unknown key; did you mean 'row_wise'?", "intra_host_latency_ms: expected a number",
      "coefficients.weighted_kernel_multiplier: must be between 0 and"]),
    ("machine block", "machine: {device: tpu, torch_version: 2.5, world_size: 3, local_world_size: 2, "
     "measured_at: yesterday}\n",
     ["machine.device: expected one of cpu, cuda", "write it in quotes", "not a multiple of local_world_size",
      "machine.measured_at: expected an ISO 8601 time"]),
    ("by_kernel that never applies", "coefficients: {by_kernel: {data_parallel: {fused: {}}, row_wise: {dense: {}}}}\n",
     ["data_parallel never runs on the fused kernel", "row_wise never runs on the dense kernel"]),
    ("not YAML", "bandwidths: {hbm_mem_bw: [\n", ["not valid YAML"]),
    ("empty file", "", ["the file is empty"]),
    ("a list", "- 1\n- 2\n", ["expected a mapping of keys"]),
    ("another format", "format: shardflow.profile/v9\n", ["expected 'shardflow.profile/v1'"]),
    ("a cuda profile on cpu ranks", "machine: {device: cuda}\n",
     ["measured on cuda, the topology plans for cpu"]),
    ("a kernel cpu ranks lack", "kernel_bandwidths: {fused_uvm: 10GB/s}\n",
     ["no cpu rank runs the fused_uvm kernel"]),
]


@pytest.mark.parametrize("text, expected", [c[1:] for c in BAD_PROFILES], ids=[c[0] for c in BAD_PROFILES])
def test_bad_profile_exits_2_naming_every_problem_and_writes_nothing(text, expected, tmp_path, capsys):
    out = tmp_path / "out"
    code = main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--profile", str(write(tmp_path, text)),
                 "--out", str(out)])
    captured = capsys.readouterr()
    screen = captured.out + captured.err
    assert code == 2
    assert "Traceback" not in screen and len(screen.splitlines()) <= SCREEN_LINES
    for text_expected in expected:
        assert text_expected in screen, text_expected
    assert not out.exists() or not any(p for p in out.iterdir() if not p.name.startswith("."))


@pytest.mark.parametrize("name, reason", [("profile.txt", "unsupported extension"), ("missing.yaml", "no such file")])
def test_unreadable_profile_file_exits_2(name, reason, tmp_path, capsys):
    path = write(tmp_path, "{}", "profile.txt") if name.endswith(".txt") else tmp_path / name
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--profile", str(path),
                 "--out", str(tmp_path / "out")]) == 2
    assert reason in capsys.readouterr().err


def test_the_flows_take_the_profile_as_a_path_setting(tmp_path):
    from flows.deployments import absolute_paths
    from flows.pipeline import pipeline_flow
    from flows.plan import plan_flow
    from flows.replan import replan_flow

    for flow in (plan_flow, pipeline_flow, replan_flow):  # relative paths in deployments resolve like spec_path
        resolved = absolute_paths(flow, {"searching": {"profile": "p.yaml"}}, tmp_path)
        assert resolved["searching"]["profile"] == str(tmp_path / "p.yaml")


def test_the_library_refuses_a_profile_of_another_device_too():
    with pytest.raises(InputError, match="measured on cuda"):
        plan_spec(read_spec(DEMO), read_topology(CPU_2PROC), CostConfig(profile=read_profile(SAMPLE)))


# ---------------------------------------------------------------- the YAML form and the hash


def test_written_profile_reads_back_equal_with_the_same_hash(tmp_path):
    profile = read_profile(write(tmp_path, CPU_PROFILE))
    again = read_profile(write(tmp_path, dumps_profile(profile), "again.yaml"))
    assert again == profile and profile_hash(again) == profile_hash(profile)
    assert profile_from_dict(json.loads(json.dumps(profile_to_dict(profile)))) == profile  # JSON too
    assert profile.machine is not None and profile.machine.measured_at == "2025-06-01T12:00:00+00:00"
    c = profile.coefficients
    assert (c.weighted_feature_bwd_compute_multiplier, c.weighted_kernel_multiplier) == (1.25, 0.9)


def test_hash_ignores_how_a_profile_is_written_but_not_what_it_says():
    a = profile_from_dict({"bandwidths": {"ddr_mem_bw": "20GB/s"}, "name": "x"})
    b = profile_from_dict({"name": "x", "bandwidths": {"ddr_mem_bw": 2e10},
                           "coefficients": {"row_wise": {"fwd": {"lookup_size_multiplier": 1}}}})
    assert profile_hash(a) == profile_hash(b)
    assert profile_hash(a) != profile_hash(replace(a, name="y"))
    assert profile_hash(a) != profile_hash(profile_from_dict({"bandwidths": {"ddr_mem_bw": "21GB/s"}, "name": "x"}))
    # A bwd block of default coefficients is not the same as no bwd block (forward x multiplier).
    with_bwd = profile_from_dict({"coefficients": {"row_wise": {"bwd": {}}}})
    assert not with_bwd.is_default and profile_to_dict(with_bwd)["coefficients"] == {"row_wise": {"bwd": {}}}
    assert profile_from_dict({}) == DEFAULT_PROFILE and profile_to_dict(DEFAULT_PROFILE) == {"format": PROFILE_FORMAT}


def test_fitted_numbers_build_a_profile_directly():
    """What calibration does: put fitted numbers (bytes/s, plain floats) in the YAML form, validate, write."""
    fitted = {"name": "fit", "bandwidths": {"intra_host_bw": 1.23e9},
              "coefficients": {"table_wise": {"fwd": {"lookup_size_multiplier": 0.8, "fixed_ms": 0.011}}},
              "machine": {"device": "cpu", "world_size": 2, "local_world_size": 2}}
    profile = profile_from_dict(fitted)
    assert profile.bandwidths.intra_host_bw == 1.23e9
    assert profile.coefficients.of(ShardingType.TABLE_COLUMN_WISE, ComputeKernel.FUSED).fwd.fixed_ms == 0.0
    assert profile.coefficients.of(ShardingType.TABLE_WISE, ComputeKernel.FUSED).fwd.fixed_ms == 0.011
    assert read_profile(Path(SAMPLE)).name == "h100-sxm-datasheet"


def test_compute_time_is_linear_in_the_coefficients_which_is_what_a_least_squares_fit_needs():
    """fwd_compute = sum of coefficient x (the time with that coefficient alone at 1): a design matrix."""
    topology = read_topology(H100_2X8)
    spec = mixed_spec(0)
    from rec.cost.shards import layout
    from rec.cost.tables import table_arrays

    cols = table_arrays(spec, topology.batch_size, CostConfig(), world_size=topology.world_size)
    lay = layout(ShardingType.TABLE_WISE, cols.rows, cols.dims, topology.world_size, topology.local_world_size)

    def fwd(**coefficients: float) -> np.ndarray:
        values = {f.name: 0.0 for f in fields(profile_types.PerfCoefficient)}
        values.update(coefficients)
        c = profile_types.PerfCoefficient(**values)
        profile = Profile(coefficients=profile_types.Coefficients(table_wise=profile_types.ShardingCoefficients(c)))
        hw = links(topology, profile)
        perf = shard_perf(ShardingType.TABLE_WISE, ComputeKernel.FUSED, topology, profile, hw,
                          kernel_bw(hw, profile, ComputeKernel.FUSED, 0.2), lay.rows, lay.cols, cols.elem,
                          cols.batch_inputs, cols.batch_outputs)
        return perf.fwd_compute

    theta = {"input_read_size_multiplier": 0.7, "lookup_size_multiplier": 1.9, "embedding_output_multiplier": 0.4,
             "hash_size_multiplier": 1e-4, "fixed_ms": 0.003}
    basis = sum(value * fwd(**{name: 1.0}) for name, value in theta.items() if name != "fixed_ms")
    np.testing.assert_allclose(fwd(**theta), basis + theta["fixed_ms"], rtol=1e-12)


# ---------------------------------------------------------------- docs


def test_every_profile_key_is_documented():
    text = (ROOT / "docs" / "profile.md").read_text(encoding="utf-8")
    keys = list(KEYS)
    for cls in (profile_types.Bandwidths, profile_types.KernelBandwidths, profile_types.PerfCoefficient,
                profile_types.Extensions, profile_types.Machine, profile_types.Coefficients):
        keys += [f.name for f in fields(cls)]
    keys += ["fwd", "bwd", "hash"]
    assert [k for k in keys if f"`{k}`" not in text] == []
    assert re.search(r"`planner\.profile`|`profile`", (ROOT / "docs" / "plan-format.md").read_text())
