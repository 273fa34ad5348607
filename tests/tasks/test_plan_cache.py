"""The plan cache holds plain plan.json files, read back through the same checks as any plan:
nothing is unpickled, and an edited entry is searched again rather than trusted."""

from __future__ import annotations

import json
import pickle
from pathlib import Path

from tasks.ingest import ingest
from tasks.search import SearchSettings, plan_key, search_plan

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "examples" / "specs" / "cpu_demo.yaml"
CPU_2PROC = ROOT / "examples" / "topologies" / "cpu_2proc.yaml"


class Boom:
    def __reduce__(self):
        return (Path("/tmp/shardflow-pickle-ran").touch, ())


def test_a_plan_is_cached_as_json_and_found_again(tmp_path):
    inputs = ingest(str(DEMO), str(CPU_2PROC))
    first = search_plan(inputs, SearchSettings(), str(tmp_path))
    again = search_plan(inputs, SearchSettings(), str(tmp_path))
    assert (first.cached, again.cached) == (False, True)
    assert again.plan == first.plan
    entry = tmp_path / plan_key(inputs, SearchSettings())
    assert json.loads((entry / "plan.json").read_text())["plan_id"] == first.plan.plan_id
    assert all(not p.read_bytes().startswith(b"\x80") for p in tmp_path.rglob("*") if p.is_file())


def test_an_edited_or_crafted_cache_entry_is_searched_again_not_trusted(tmp_path):
    inputs = ingest(str(DEMO), str(CPU_2PROC))
    plan = search_plan(inputs, SearchSettings(), str(tmp_path)).plan
    entry = tmp_path / plan_key(inputs, SearchSettings())
    edited = json.loads((entry / "plan.json").read_text())
    edited["topology"]["world_size"] = 4
    (entry / "plan.json").write_text(json.dumps(edited))
    found = search_plan(inputs, SearchSettings(), str(tmp_path))
    assert not found.cached and found.plan == plan

    Path("/tmp/shardflow-pickle-ran").unlink(missing_ok=True)
    (entry / "plan.json").write_bytes(pickle.dumps(Boom()))
    found = search_plan(inputs, SearchSettings(), str(tmp_path))
    assert not found.cached and found.plan == plan
    assert not Path("/tmp/shardflow-pickle-ran").exists()
