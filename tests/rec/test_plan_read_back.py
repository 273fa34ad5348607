"""A plan is a typed value, read back from plan.json once, validated, and written back byte for byte.

``plans_before/`` holds plans written by the code before the Plan was typed (commit a0c9f3a, where
``Plan.topology`` and ``Plan.planner`` were dicts): every kind of planner identity (local, Ray keys,
replanned, a profile, TorchRec's made_by), format v3 (modules), data_parallel replicas, a bound the
MILP proved, and one plan directory with its shards.parquet and movement.parquet. And
``cache_beside_sized_v3``, written by the drop-in planner at commit 20bc2c1 (before v5): a cache of
TorchRec's default size, with statistics, beside a sharder's other size, which every cache states.
Written at commit eb75533 (before v6): ``cache_beside_unplaced_v5``, the search's plan of a cache of
the default size in the module of a table sized otherwise but kept in HBM, and another cache left
unstated; ``chosen_beside_default_v4``, a plan that chose one cache's size beside a default one.
Written at commit 2fc8151~1, before the cost model priced the rows a cache with statistics fetches:
``cache_fetches_unpriced_v4``, caches sized for tables with a hit-rate curve and the distinct ids of a
global batch, whose estimates hold under the cost model of that day."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from rec.analysis import check_plan
from rec.config.planner_identity import MadeBy, PlannerIdentity
from rec.config.search import SearchConfig
from rec.cost.tables import CacheRule
from rec.errors import InputError
from rec.plan import BoundMethod, Movement, dumps_plan, parse_plan, plan_from_dict, read_plan, write_plan
from rec.plan.plan_id import identity_problems, plan_id
from rec.planning import plan_spec
from rec.profile import Profile
from rec.spec.synthetic import issue2282_spec
from rec.spec.types import Spec
from rec.topology import Topology, topology_from_dict
from tests.paths import ROOT

BEFORE = ROOT / "tests" / "rec" / "plans_before"
PLAN_IDS = {"cpu_demo": "5e1e111ad8e76c0f", "two_tower_seq_v3": "0f2113817ccb77c7", "replanned": "b3b01ec9e3ef4693",
            "profile": "258eb7cdcfda315e", "cuda_dp_rw": "47829faee745bad9", "ray_keys": "2aa58b673a5d798b",
            "made_by_torchrec": "8a5a5a9f891c7846", "cache_beside_sized_v3": "fd9d975bee53002c",
            "cache_beside_unplaced_v5": "c1e1c27e8e6bd908", "chosen_beside_default_v4": "30252089a555cad4",
            "cache_fetches_unpriced_v4": "d070822282cdd15a"}


@pytest.mark.parametrize("name", sorted(PLAN_IDS))
def test_plans_written_before_the_plan_was_typed_read_back_and_write_byte_identical(name):
    text = (BEFORE / f"{name}.json").read_text()
    plan = parse_plan(text, name)
    check_plan(plan)
    assert plan.plan_id == PLAN_IDS[name] == plan_id(plan.spec_hash, plan.topology.topology_hash, plan.planner)
    assert dumps_plan(plan) == text


OLDER = {"first_day_v1_1021a15": ("513d43995d87319a",
                                  ("refine_top", "switch_above_gap", "switch_steps", "time_limit_s")),
         "before_the_exact_stage_v2_6152975": ("0ab36289ee007e53", ("time_limit_s",))}


@pytest.mark.parametrize("name", sorted(OLDER))
def test_plans_written_before_a_search_knob_existed_read_back_and_replan(name, tmp_path, capsys):
    """Written by commits 1021a15 (v1) and 6152975 (v2), the cpu demo on 2 cpu ranks: their
    planner.search lacks the knobs added since, and every reader refused them ("is required")."""
    from flows.cli import main
    from rec.config.search import KNOBS_ADDED_LATER
    from tests.paths import CPU_2PROC, DEMO

    recorded, unrecorded = OLDER[name]
    path = BEFORE / f"{name}.json"
    plan = parse_plan(path.read_text(), name)
    check_plan(plan)
    assert plan.plan_id == recorded == plan_id(plan.spec_hash, plan.topology.topology_hash, plan.planner)
    assert plan.planner.unrecorded == unrecorded and plan.planner.search is not None
    assert {k: getattr(plan.planner.search, k) for k in unrecorded} == {k: KNOBS_ADDED_LATER[k] for k in unrecorded}
    again = parse_plan(dumps_plan(plan), name)  # written again as that version wrote it: the same id
    assert again.plan_id == recorded and again.planner.unrecorded == unrecorded
    code = main(["plan", "--no-track", "--no-chart", str(DEMO), "--topology", str(CPU_2PROC), "--previous", str(path),
                 "--out", str(tmp_path / "replanned"), "--state-dir", str(tmp_path / "state")])
    assert code == 0, capsys.readouterr()
    assert read_plan(tmp_path / "replanned").previous_plan_id == recorded
    edited = json.loads((BEFORE / "cpu_demo.json").read_text())  # a knob dropped from a plan that has it
    del edited["planner"]["search"]["time_limit_s"]
    with pytest.raises(InputError, match="edited"):
        plan_from_dict(edited)


def test_a_plan_directory_written_before_is_written_again_byte_identical(tmp_path):
    plan = read_plan(BEFORE / "replanned_dir")
    check_plan(plan)
    write_plan(plan, tmp_path / "again")
    for name in ("plan.json", "shards.parquet", "movement.parquet"):
        assert (tmp_path / "again" / name).read_bytes() == (BEFORE / "replanned_dir" / name).read_bytes(), name


def test_a_plan_read_back_is_typed_all_the_way_down():
    plan = parse_plan((BEFORE / "replanned.json").read_text(), "replanned")
    assert isinstance(plan.topology, Topology) and isinstance(plan.spec, Spec)
    assert isinstance(plan.planner, PlannerIdentity) and isinstance(plan.planner.search, SearchConfig)
    assert plan.planner.previous_plan_id is not None and plan.planner.max_regress == 0.02
    assert isinstance(plan.metrics.bound_method, BoundMethod) and isinstance(plan.metrics.movement, Movement)
    assert len(plan.metrics.movement.bytes_in) == plan.world_size
    ray = parse_plan((BEFORE / "ray_keys.json").read_text(), "ray").planner
    assert (ray.backend, ray.groups) == ("ray", 3)
    torchrec = parse_plan((BEFORE / "made_by_torchrec.json").read_text(), "torchrec").planner
    assert torchrec.search is None and isinstance(torchrec.made_by, MadeBy) and torchrec.made_by.seconds == 12.346
    profiled = parse_plan((BEFORE / "profile.json").read_text(), "profile").planner
    assert isinstance(profiled.profile, Profile) and profiled.profile.name == "cpu-loopback"


def test_a_number_keeps_the_form_it_was_written_in_so_its_plan_id_holds(tmp_path):
    """A library caller's ``time_limit_s=5`` (an int where a float is typed) is part of the plan_id as
    5, not 5.0: read back, the plan keeps its id."""
    topology = topology_from_dict({"world_size": 2, "compute_device": "cpu"})
    plan = plan_spec(issue2282_spec(6), topology, config=SearchConfig(time_limit_s=5))
    assert '"time_limit_s":5}' in dumps_plan(plan)
    again = parse_plan(dumps_plan(plan), "plan")
    assert identity_problems(again) == [] and dumps_plan(again) == dumps_plan(plan)


def refused(d: dict) -> str:
    with pytest.raises(InputError) as e:
        plan_from_dict(d)
    return e.value.render()


def test_a_v1_plan_reads_back_and_checks_whether_or_not_its_bound_meets_its_critical_path():
    """v1 states neither how its bound was proven nor ``optimal``: a v1 plan whose bound meets its
    critical path was once refused for an ``optimal`` it never stated."""
    v2 = json.loads((BEFORE / "cpu_demo.json").read_text())
    metrics = {k: v for k, v in v2["metrics"].items() if k not in ("bound_method", "optimal")}
    v1 = {**v2, "format": "shardflow.plan/v1", "metrics": {**metrics, "planning_s": 0.5}}
    for bound in (metrics["lower_bound"], metrics["critical_path"]):
        gap = (metrics["critical_path"] - bound) / bound
        plan = plan_from_dict({**v1, "metrics": {**v1["metrics"], "lower_bound": bound, "gap": gap}})
        check_plan(plan)
        assert plan.plan_id == PLAN_IDS["cpu_demo"]


def test_the_format_is_checked_against_the_content():
    v3 = json.loads((BEFORE / "two_tower_seq_v3.json").read_text())
    assert "such a plan is shardflow.plan/v3" in refused({**v3, "format": "shardflow.plan/v2"})
    v2 = json.loads((BEFORE / "cpu_demo.json").read_text())
    assert "every table is in the default module" in refused({**v2, "format": "shardflow.plan/v3"})
    text = refused({**v2, "format": "shardflow.plan/v1"})
    assert "format shardflow.plan/v1 has no such key" in text and "replicated" not in text  # cpu_demo: none
    dp = json.loads((BEFORE / "cuda_dp_rw.json").read_text())
    assert "table 'dense'.replicated, metrics.bound_method" in refused({**dp, "format": "shardflow.plan/v1"})


def test_an_embedded_profile_is_checked_against_the_topology_when_read_and_when_checked():
    plan = parse_plan((BEFORE / "profile.json").read_text(), "profile")
    other = topology_from_dict({"world_size": 2, "compute_device": "cuda"})
    moved = replace(plan, topology=other)
    with pytest.raises(InputError, match=r"planner\.profile\.machine\.device: the profile was measured on cpu"):
        check_plan(replace(moved, plan_id=plan_id(plan.spec_hash, other.topology_hash, plan.planner)))
    with pytest.raises(InputError, match="the topology plans for cuda"):
        parse_plan(dumps_plan(moved), "moved")


def test_edits_to_what_the_plan_id_covers_are_named_when_read(tmp_path):
    d = json.loads((BEFORE / "cpu_demo.json").read_text())
    d["topology"]["batch_size"] = 1024
    d["planner"]["search"]["refine_top"] = 3
    text = refused(d)
    assert "its content gives plan_id" in text and "was edited after planning" in text
    d = json.loads((BEFORE / "cpu_demo.json").read_text())
    d["spec"][0]["pooling_factor"] = 2.0
    assert "its spec rows hash to" in refused(d)


@pytest.mark.parametrize("edit, expected", [
    (lambda d: d["planner"].update(backend="ray"), "groups: is required with backend"),
    (lambda d: d["planner"].update(backend="cloud", groups=0), "expected one of ray, auto, got 'cloud'"),
    (lambda d: d["planner"]["cost"].update(optimizer="lion"), "planner.cost.optimizer: expected one of none"),
    (lambda d: d["planner"]["search"].update(shard_limits=0), "planner.search.shard_limits: must be > 0"),
    (lambda d: d["planner"].update(made_by={"name": "shardflow"}), "planner.made_by.name: expected one of torchrec"),
    (lambda d: d["planner"]["search"].pop("shard_limits"), "planner.search.shard_limits: is required"),
    (lambda d: d.update(plan_id="../../etc/passwd"), "plan_id: expected 16 hexadecimal digits"),
    (lambda d: d.update(previous_plan_id="0123456789abcdef"), "previous_plan_id: says 0123456789abcdef, the "
                                                              "planner (which the plan_id covers) None"),
    (lambda d: d["tables"][0]["est"].update(perf=-1.0), "est.perf: must be >= 0"),
    (lambda d: d["tables"][0]["shards"].clear(), "shards: expected a list of shards, got []"),
    (lambda d: d["tables"][0].update(name="a\x1bb"), "tables[0].name: 'a\\x1bb' holds a control character"),
])
def test_the_planner_tables_and_ids_are_validated_key_by_key(edit, expected):
    d = json.loads((BEFORE / "cpu_demo.json").read_text())
    edit(d)
    assert expected in refused(d)


def test_a_plan_from_anywhere_is_read_by_the_one_reader(tmp_path):
    """plan.json named on its own, its directory, and the text (the plan cache, rank 0's broadcast)."""
    path = tmp_path / "plan.json"
    path.write_text((BEFORE / "cpu_demo.json").read_text())
    plans = [read_plan(path), parse_plan(path.read_bytes(), path), plan_from_dict(json.loads(path.read_text()))]
    assert plans[0] == plans[1] == plans[2]
    assert Path(BEFORE / "cpu_demo.json").read_text() == dumps_plan(plans[0])


def test_a_plan_made_when_every_cache_stated_its_size_is_built_and_priced_so():
    """Before format v5 a plan stated every cache's size where any table's differed from TorchRec's
    default, and priced the fetches of each: read back, its sharding plan states them, and its
    estimates are recomputed so (check_plan above passes)."""
    from rec.plan.torchrec_plan import to_sharding_plan

    plan = parse_plan((BEFORE / "cache_beside_sized_v3.json").read_text(), "v3")
    assert plan.cache_rule is CacheRule.EVERY and plan.format == "shardflow.plan/v3"
    assert to_sharding_plan(plan).plan["ebc"]["big"].cache_params.load_factor == 0.2


@pytest.mark.parametrize("name, stated", [("cache_beside_unplaced_v5", {"big": 0.2, "other": None}),
                                          ("chosen_beside_default_v4", {"big": 0.2, "mid": 0.1})])
def test_a_plan_made_before_v6_states_the_caches_it_was_planned_with(name, stated):
    """A v5 plan stated a default cache in the module of a table sized otherwise, though the table was
    kept in HBM; a v4 plan stated every cache once it chose one size. v6 would leave those default
    caches unstated. Read back, each is built and priced as it was planned (check_plan above passes)."""
    from rec.plan.torchrec_plan import to_sharding_plan

    plan = parse_plan((BEFORE / f"{name}.json").read_text(), name)
    built = to_sharding_plan(plan).plan["ebc"]
    assert {t: built[t].cache_params.load_factor if built[t].cache_params else None for t in stated} == stated
    assert replace(plan, cache_rule=CacheRule.PLACED).format == "shardflow.plan/v6"


def test_a_spec_or_topology_given_as_a_plan_is_named_as_one():
    from tests.paths import CPU_2PROC, DEMO

    for given in (DEMO, CPU_2PROC):
        with pytest.raises(InputError) as refused:
            read_plan(given)
        shown = refused.value.render()
        assert "not valid JSON" in shown and "is a spec, a topology or data, not a plan" in shown
    with pytest.raises(InputError) as refused:  # a plan's own shards.parquet is no spec
        read_plan(BEFORE / "replanned_dir" / "shards.parquet")
    assert "not a plan" not in refused.value.render()


def test_a_plan_of_the_cost_model_before_cache_fetches_were_priced_is_still_refused_once_edited():
    """Its estimates hold under that day's cost model or today's: an est matching neither is an edit."""
    d = json.loads((BEFORE / "cache_fetches_unpriced_v4.json").read_text())
    d["tables"][0]["est"]["perf"] *= 0.99
    with pytest.raises(InputError) as refused:
        check_plan(parse_plan(json.dumps(d), "edited"))
    assert f"table {d['tables'][0]['module']}.{d['tables'][0]['name']}: est says" in refused.value.render()
