"""An edited plan.json, through every command that reads plans (``show``, ``train``, ``measure``, ``plan
--previous``): exit 2 naming every problem, never a traceback, a warning or an escaped newline, and nothing
written or launched. One case per class of problem (a value of the wrong type, a key missing, a number too
large for 64 bits, a profile for other ranks, a format its content contradicts), and all of them at once."""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

import pytest

from flows.cli import main
from rec.plan import dumps_plan, parse_plan
from rec.plan.plan_id import plan_id
from rec.sharding import ComputeDevice
from tests.paths import CPU_2PROC, DEMO, ROOT

BEFORE = ROOT / "tests" / "rec" / "plans_before"
Edit = Callable[[dict], None]


def payload(name: str = "cpu_demo") -> dict:
    return json.loads((BEFORE / f"{name}.json").read_text())


def sharded(d: dict) -> dict:
    return next(t for t in d["tables"] if not t.get("replicated"))


def set_planner(d: dict) -> None:
    d["planner"] = "x"


def set_device(d: dict) -> None:
    d["topology"]["compute_device"] = "tpu"


def delete_local_world_size(d: dict) -> None:
    del d["topology"]["local_world_size"]


def set_rows(d: dict) -> None:
    d["spec"][0]["num_embeddings"] = "lots"


def set_huge_shard(d: dict) -> None:
    sharded(d)["shards"][0]["sizes"] = [2**63, 64]


def set_world_zero(d: dict) -> None:
    d["topology"]["world_size"] = 0


def set_metric_types(d: dict) -> None:
    d["metrics"].update(rank_hbm=["a", "b"], bound_method="guessed", optimal="yes")


def set_odd_keys(d: dict) -> None:
    d["plan_idd"] = d.pop("plan_id")
    sharded(d)["sharding_typ"] = sharded(d).pop("sharding_type")


def set_many(d: dict) -> None:
    for edit in (set_planner, set_device, set_rows, set_huge_shard):
        edit(d)


def relabelled(name: str, label: str) -> Edit:
    def edit(d: dict) -> None:
        d.clear()
        d.update(payload(name), format=label)

    return edit


def cuda_profile_on_cpu_ranks(d: dict) -> None:
    """The embedded profile says it was measured on cuda; its hash and the plan_id are made to match."""
    plan = parse_plan((BEFORE / "profile.json").read_text(), "profile.json")
    profile = plan.planner.profile
    assert profile.machine is not None
    edited = replace(profile, machine=replace(profile.machine, device=ComputeDevice.CUDA))
    planner = replace(plan.planner, cost=replace(plan.planner.cost, profile=edited))
    d.clear()
    d.update(json.loads(dumps_plan(replace(plan, planner=planner,
                                           plan_id=plan_id(plan.spec_hash, plan.topology.topology_hash, planner)))))


CASES: dict[str, tuple[Edit, list[str]]] = {
    "planner is text": (set_planner, ["planner: expected a mapping, got 'x'"]),
    "compute_device tpu": (set_device, ["topology.compute_device: expected one of cpu, cuda, got 'tpu'"]),
    "local_world_size deleted": (delete_local_world_size, ["topology.local_world_size: is required"]),
    "num_embeddings text": (set_rows, ["spec: table 'user_id': num_embeddings: expected a positive integer, "
                                       "got 'lots'"]),
    "a shard of 2^63 rows": (set_huge_shard, ["shards[0].sizes: must be at most 4,398,046,511,104"]),
    "world_size 0": (set_world_zero, ["topology.world_size: must be > 0, got 0"]),
    "metrics of the wrong types": (set_metric_types, [
        "metrics: rank_hbm must list 2 integers (bytes), one per rank",
        "metrics.bound_method: expected one of largest_shard", "metrics.optimal: expected true or false"]),
    "misspelt keys": (set_odd_keys, ["plan_idd: unknown key; did you mean 'plan_id'?",
                                     "sharding_typ: unknown key; did you mean 'sharding_type'?",
                                     "plan_id, table 'user_id'.sharding_type: is required"]),
    "a cuda profile on cpu ranks, hashes recomputed": (cuda_profile_on_cpu_ranks, [
        "planner.profile.machine.device: the profile was measured on cuda, the topology plans for cpu"]),
    "a v3 plan relabelled v2": (relabelled("two_tower_seq_v3", "shardflow.plan/v2"), [
        "format: says shardflow.plan/v2, but table", "such a plan is shardflow.plan/v3"]),
    "a v2 plan relabelled v3": (relabelled("cpu_demo", "shardflow.plan/v3"), [
        "format: says shardflow.plan/v3, but every table is in the default module"]),
    "a v2 plan relabelled v1": (relabelled("cpu_demo", "shardflow.plan/v1"), [
        "metrics.bound_method, metrics.optimal: format shardflow.plan/v1 has no such key"]),
    "four problems at once": (set_many, [
        "planner: expected a mapping", "topology.compute_device: expected one of", "num_embeddings: expected a "
        "positive integer", "shards[0].sizes: must be at most"]),
}


def commands(plan: Path, out: Path) -> dict[str, list[str]]:
    return {
        "show": ["show", str(plan)],
        "train": ["train", "--plan", str(plan), "--out", str(out), "--iterations", "3", "--warmup", "1", "--no-track"],
        "measure": ["measure", "--plan", str(plan), "--out", str(out), "--no-track"],
        "plan --previous": ["plan", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(out), "--previous",
                            str(plan)],
    }


@pytest.mark.parametrize("case", list(CASES))
def test_an_edited_plan_is_refused_by_every_command_naming_every_problem(case, tmp_path, capfd):
    edit, expected = CASES[case]
    d = payload()
    edit(d)
    path = tmp_path / "edited" / "plan.json"
    path.parent.mkdir()
    path.write_text(json.dumps(d))
    out = tmp_path / "out"
    for command, argv in commands(path, out).items():
        code = main(argv)
        err = capfd.readouterr().err
        assert code == 2, (command, err)
        missing = [text for text in expected if text not in err]
        assert missing == [], (command, err)
        assert "Traceback" not in err and "Warning" not in err and "\\n" not in err, (command, err)
        assert not out.exists(), command  # nothing written, nothing launched


def test_the_plans_all_commands_read_are_the_plans_they_wrote(tmp_path, capfd):
    """The control: the unedited plan passes where the edited ones are refused."""
    path = tmp_path / "plan.json"
    path.write_text((BEFORE / "cpu_demo.json").read_text())
    assert main(["show", str(path)]) == 0
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "out"),
                 "--previous", str(path)]) == 0
    assert "Traceback" not in capfd.readouterr().err


def test_a_plan_directory_missing_its_shards_is_named_beside_plan_jsons_problems(tmp_path, capfd):
    d = payload()
    set_many(d)
    (tmp_path / "plan.json").write_text(json.dumps(d))
    assert main(["show", str(tmp_path)]) == 2
    err = capfd.readouterr().err
    assert "planner: expected a mapping" in err and f"{tmp_path / 'shards.parquet'}: is missing" in err
