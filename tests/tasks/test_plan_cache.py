"""The plan cache holds plain plan.json files with a digest signed under a secret of the state
directory: nothing is unpickled, and an entry that is not exactly what the search wrote for its
inputs (edited, planted, moved, its digest forged) is searched again with one line, not trusted."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import shutil
from pathlib import Path

from rec.plan.io import plan_from_dict
from tasks.ingest import ingest
from tasks.plan_cache import read_entry, secret_path
from tasks.search import SearchSettings, plan_key, search_plan
from tests.paths import CPU_2PROC, DEMO, H100
from tests.rec.plan_edits import all_on_rank_0


class Boom:
    def __reduce__(self):
        return (Path("/tmp/shardflow-pickle-ran").touch, ())


def test_a_plan_is_cached_as_json_and_found_again(tmp_path, demo_inputs):
    inputs = demo_inputs
    cache = tmp_path / "cache"
    first = search_plan(inputs, SearchSettings(), str(cache))
    again = search_plan(inputs, SearchSettings(), str(cache))
    assert (first.cached, again.cached) == (False, True)
    assert again.plan == first.plan
    entry = cache / plan_key(inputs, SearchSettings())
    assert json.loads((entry / "plan.json").read_text())["plan_id"] == first.plan.plan_id
    assert sorted(p.name for p in entry.iterdir() if not p.name.startswith(".")) == \
        ["cache-digest.json", "plan.json", "shards.parquet"]
    assert all(not p.read_bytes().startswith(b"\x80") for p in cache.rglob("*") if p.is_file())


def test_an_edited_or_crafted_cache_entry_is_searched_again_not_trusted(tmp_path, demo_inputs):
    tmp_path = tmp_path / "cache"
    inputs = demo_inputs
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


# -- the digest: only what the search wrote for these inputs is used --------------------------

def cached_entry(tmp_path):
    inputs = ingest(str(DEMO), str(CPU_2PROC))
    first = search_plan(inputs, SearchSettings(), str(tmp_path / "cache"))
    return inputs, first.plan, tmp_path / "cache" / plan_key(inputs, SearchSettings())


def searched_again(inputs, cache, caplog) -> str:
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        found = search_plan(inputs, SearchSettings(), str(cache))
    assert not found.cached
    lines = [r.getMessage() for r in caplog.records if r.getMessage().startswith("plan cache:")]
    assert len(lines) >= 1, caplog.text
    return "\n".join(lines)


def test_a_sound_true_plan_planted_with_a_digest_made_without_the_secret_is_searched_again(tmp_path, caplog):
    inputs, plan, entry = cached_entry(tmp_path)
    forged = all_on_rank_0(json.loads((entry / "plan.json").read_text()))
    (entry / "plan.json").write_text(json.dumps(forged))
    digest = json.loads((entry / "cache-digest.json").read_text())
    digest["sha256"]["plan.json"] = hashlib.sha256((entry / "plan.json").read_bytes()).hexdigest()
    (entry / "cache-digest.json").write_text(json.dumps(digest))
    assert plan_from_dict(forged).metrics.critical_path > 1.5 * plan.metrics.critical_path
    line = searched_again(inputs, tmp_path / "cache", caplog)
    assert f"entry {entry.name} does not match its inputs" in line and "this state directory's key" in line
    again = search_plan(inputs, SearchSettings(), str(tmp_path / "cache"))
    assert again.cached and again.plan == plan  # the entry was written anew by the search


def test_an_entry_moved_under_another_key_or_without_its_digest_is_searched_again(tmp_path, caplog):
    inputs, _, entry = cached_entry(tmp_path)
    other = ingest(str(DEMO), str(H100))
    shutil.copytree(entry, tmp_path / "cache" / plan_key(other, SearchSettings()))
    assert f"made for entry '{entry.name}'" in searched_again(other, tmp_path / "cache", caplog)
    (entry / "cache-digest.json").unlink()
    assert "cache-digest.json is missing" in searched_again(inputs, tmp_path / "cache", caplog)


def test_a_key_file_others_can_read_is_replaced_and_voids_the_entries(tmp_path, caplog):
    inputs, _, _ = cached_entry(tmp_path)
    key = secret_path(tmp_path / "cache")
    assert key.parent == tmp_path and oct(key.stat().st_mode & 0o777) == "0o600"
    os.chmod(key, 0o644)
    text = searched_again(inputs, tmp_path / "cache", caplog)
    assert f"the key {key} is not private to this user" in text and "this state directory's key" in text
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    assert search_plan(inputs, SearchSettings(), str(tmp_path / "cache")).cached


def test_a_cache_that_cannot_be_written_is_one_line_not_a_failure(tmp_path, caplog, demo_inputs):
    inputs = demo_inputs
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / plan_key(inputs, SearchSettings())).write_text("a file where the entry would go")
    with caplog.at_level(logging.WARNING):
        found = search_plan(inputs, SearchSettings(), str(tmp_path / "cache"))
    assert not found.cached and "plan cache: cannot store plan" in caplog.text
    assert read_entry(tmp_path / "cache", "0" * 16, lambda plan: None).plan is None  # absent: no line


def test_a_cached_plan_of_an_earlier_cost_model_is_searched_again_not_served(tmp_path):
    """A plan made before cache fetches were priced is read back where a user hands it in, but the
    cache serves only today's search: its entry is a miss, as an edited one is."""
    from rec.analysis import check_plan
    from rec.plan import parse_plan
    from tasks.plan_cache import write_entry
    from tests.paths import ROOT

    plan = parse_plan((ROOT / "tests/rec/plans_before/cache_fetches_unpriced_v4.json").read_text(), "old")
    check_plan(plan)  # handed in: used
    write_entry(tmp_path / "cache", plan.plan_id, plan)
    found = read_entry(tmp_path / "cache", plan.plan_id, lambda p: None)
    assert found.plan is None and "est says" in (found.refused or ""), found
