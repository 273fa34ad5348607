"""``shardflow train`` checks the plan it is given before any process starts: an edited, corrupt or
foreign plan.json gets exit 2 and one message, never a traceback from the ranks."""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest

from flows.cli import main
from tests.paths import CPU_2PROC, DEMO


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("plan")
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(out), "--no-chart"]) == 0
    return json.loads((out / "plan.json").read_text())


def first_sharded(plan: dict) -> dict:
    return next(t for t in plan["tables"] if not t.get("replicated"))


def edit_offset(p):
    first_sharded(p)["shards"][0]["offsets"] = [50_000, 0]


def edit_rank(rank):
    def edit(p):
        t = first_sharded(p)
        t["shards"][0]["rank"] = rank
        t["ranks"][0] = rank
    return edit


def edit_missing(p):
    p["tables"].pop()


def edit_duplicate(p):
    p["tables"].append(p["tables"][0])


def edit_row_wise(p):
    first_sharded(p)["sharding_type"] = "row_wise"


def edit_unknown_table(p):
    first_sharded(p)["name"] = "not_in_the_spec"


def edit_world(p):
    p["topology"]["world_size"] = 4


def edit_kernel(p):
    first_sharded(p)["compute_kernel"] = "no_such_kernel"


EDITS = {
    "shard offset out of the table": (edit_offset, "tile"),
    "rank 5 of 2": (edit_rank(5), "rank out of range"),
    "rank -1": (edit_rank(-1), "rank out of range"),
    "a table missing": (edit_missing, "missing from the plan"),
    "a table twice": (edit_duplicate, "more than once"),
    "row_wise on a cpu plan": (edit_row_wise, "not available on cpu"),
    "a table not in the spec": (edit_unknown_table, "is not in the spec"),
    "topology edited, world size 2 -> 4": (edit_world, "edited"),
    "unknown kernel": (edit_kernel, "not a valid shardflow plan"),
}


def train(plan_path: Path, tmp_path: Path, capfd) -> tuple[int, str]:
    code = main(["train", "--plan", str(plan_path), "--out", str(tmp_path / "out"), "--iterations", "3",
                 "--warmup", "1"])
    return code, capfd.readouterr().err


def assert_refused(code: int, err: str, expected: str, tmp_path: Path) -> None:
    assert code == 2, err
    assert expected in err
    assert "Traceback" not in err and len(err.splitlines()) < 25
    assert not (tmp_path / "out" / "train_metrics.json").exists()
    assert not (tmp_path / "out" / "logs").exists()  # nothing was launched


@pytest.mark.parametrize("case", list(EDITS))
def test_an_edited_plan_is_refused_before_launch(good, case, tmp_path, capfd):
    edit, expected = EDITS[case]
    plan = json.loads(json.dumps(good))
    edit(plan)
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(plan))
    assert_refused(*train(path, tmp_path, capfd), expected, tmp_path)


@pytest.mark.parametrize("content,expected", [
    (b"[1, 2, 3]", "not a shardflow plan"),
    (b"\xff\xfe\x00garbage", "not UTF-8"),
    (b'{"format": "shardflow.plan/v2", "tables": ', "Cannot read the plan"),
    (b"{}", "not a shardflow plan"),
])
def test_a_corrupt_plan_file_is_refused_before_launch(content, expected, tmp_path, capfd):
    path = tmp_path / "plan.json"
    path.write_bytes(content)
    assert_refused(*train(path, tmp_path, capfd), expected, tmp_path)


def test_a_key_written_twice_in_the_plan_is_refused_naming_the_file_and_key(good, tmp_path, capfd):
    """JSON readers keep the last of a key written twice: an edit to row_wise above the table's own
    table_wise was once silently undone, and the plan trained as it was."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(good).replace('"sharding_type": ', '"sharding_type": "row_wise", "sharding_type": ', 1))
    code, err = train(path, tmp_path, capfd)
    assert_refused(code, err, "the key 'sharding_type' is written twice", tmp_path)
    named = [line for line in err.splitlines() if "written twice" in line]
    assert len(named) == 1 and str(path) in named[0], err


def test_bad_training_settings_are_refused_before_launch(good, tmp_path, capfd):
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(good))
    for flags, expected in ((["--iterations", "0"], "--iterations"), (["--iterations", "-5"], "--iterations"),
                            (["--iterations", "5", "--warmup", "5"], "no measured iteration"),
                            (["--batch-size", "0"], "--batch-size")):
        code = main(["train", "--plan", str(path), "--out", str(tmp_path / "out"), *flags])
        assert_refused(code, capfd.readouterr().err, expected, tmp_path)


def test_an_abandoned_temporary_directory_is_removed_by_the_next_write(tmp_path):
    from rec.plan.io import TMP_PREFIX

    out = tmp_path / "plan"
    out.mkdir()
    dead = os.fork()
    if dead == 0:
        os._exit(0)
    os.waitpid(dead, 0)
    abandoned = out / f"{TMP_PREFIX}{socket.gethostname()}-{dead}-deadbeef"
    abandoned.mkdir()
    (abandoned / "plan.json").write_text("half")
    assert main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(out), "--no-chart"]) == 0
    assert not abandoned.exists()
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == ["plan.json", "shards.parquet"]
