"""Nothing a plan read back claims is trusted: its metrics are recomputed from its shards, its
shards.parquet is checked against its plan.json, and a plan directory is written as a unit."""

from __future__ import annotations

import errno
import json
import os
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flows.cli import main
from rec.analysis import check_plan
from rec.analysis.recompute import metrics_problems
from rec.config.search import SearchConfig
from rec.errors import InputError
from rec.plan import read_plan, write_plan
from rec.plan.io import plan_from_dict, plan_to_dict, write_plan_files
from rec.planning import plan_spec, replan_spec
from rec.spec import spec_from_rows
from rec.spec.columns import table_to_row
from rec.spec.synthetic import issue2282_spec
from rec.topology import topology_from_dict
from tasks.ingest import ingest
from tests.paths import CPU_2PROC, DEMO
from tests.rec.plan_edits import all_on_rank_0, chart_of, move_first_table


@pytest.fixture(scope="module")
def demo():
    inputs = ingest(str(DEMO), str(CPU_2PROC))
    return plan_spec(inputs.spec, inputs.topology)


def memory_bound_instance():
    """8 tables of up to 3 million rows on 4 cuda ranks with HBM for about half of them."""
    import numpy as np


    rng = np.random.default_rng(16)
    rows = np.rint(10 ** rng.uniform(4, 6.5, 8)).astype(int)
    dims = rng.choice((16, 32, 64, 128, 256), 8)
    spec = spec_from_rows([{"name": f"t{i}", "num_embeddings": int(rows[i]), "embedding_dim": int(dims[i]),
                            "pooling_factor": float(np.round(rng.uniform(1, 20), 1))} for i in range(8)])
    table_bytes = float((rows * dims * 4 + rows * 4).sum())
    hbm = max(table_bytes / rng.uniform(0.5, 3.0) / 4, 1.2 * float((rows * dims * 4).max()) / 4)
    return spec, topology_from_dict({"world_size": 4, "local_world_size": 2, "batch_size": 512,
                                     "compute_device": "cuda", "hbm_cap": int(hbm / 0.85) + 64 * 2**20,
                                     "ddr_cap": "64GiB"})


def refused(d: dict) -> str:
    with pytest.raises(InputError) as e:
        check_plan(plan_from_dict(d))
    return e.value.render()


@pytest.mark.parametrize("case", ["cpu", "cuda row_wise and data_parallel", "memory binds", "replanned"])
def test_plans_the_search_makes_pass_the_recomputation(case):
    cuda = {"world_size": 16, "local_world_size": 8, "compute_device": "cuda"}
    if case == "cpu":
        plan = plan_spec(issue2282_spec(60), topology_from_dict({"world_size": 4, "compute_device": "cpu"}))
    elif case == "cuda row_wise and data_parallel":
        rows = [{"name": "big", "num_embeddings": 4_000_000, "embedding_dim": 128, "sharding_types": ["row_wise"]},
                {"name": "dense", "num_embeddings": 100, "embedding_dim": 16, "sharding_types": ["data_parallel"]},
                {"name": "twrw", "num_embeddings": 300_000, "embedding_dim": 64,
                 "sharding_types": ["table_row_wise"]}]

        plan = plan_spec(spec_from_rows([*rows, *(dict(r) for r in plan_spec(
            issue2282_spec(30), topology_from_dict(cuda)).spec_tables)]), topology_from_dict(cuda))
    elif case == "memory binds":  # UVM caching kernels, a bound the MILP proved
        spec, topology = memory_bound_instance()
        fixed = spec_from_rows([{**table_to_row(t), "cache_load_factor": 0.2} for t in spec.tables])
        plan = plan_spec(fixed, topology, config=SearchConfig(time_limit_s=5))  # caches as searched: the MILP's bound
        assert plan.metrics.bound_method == "milp"
    else:
        topology = topology_from_dict({"world_size": 4, "compute_device": "cpu"})
        previous = plan_spec(issue2282_spec(60), topology)
        plan = replan_spec(issue2282_spec(70), topology, previous).plan
    read_back = plan_from_dict(json.loads(json.dumps(plan_to_dict(plan))))
    assert metrics_problems(read_back) == []
    check_plan(read_back)


def test_a_table_moved_with_its_metrics_left_alone_is_refused(demo):
    text = refused(move_first_table(plan_to_dict(demo)))
    assert "metrics.rank_perf says" in text and "its shards give" in text
    assert "metrics.critical_path" in text or "metrics.rank_ddr" in text


@pytest.mark.parametrize("edit,expected", [
    (lambda d: d["tables"][0]["est"].update(perf=d["tables"][0]["est"]["perf"] * 2), "est says"),
    (lambda d: d["tables"][0]["est"]["storage"].update(ddr=1), "est says"),
    (lambda d: d["metrics"].update(critical_path=d["metrics"]["critical_path"] * 0.5), "metrics.critical_path"),
    (lambda d: d["metrics"].update(rank_ddr_cap=[10**15, 10**15]), "metrics.rank_ddr_cap says"),
    (lambda d: d["metrics"].update(lower_bound=d["metrics"]["lower_bound"] * 0.9), "metrics.lower_bound"),
    (lambda d: d["metrics"].update(lower_bound=d["metrics"]["critical_path"] * 2), "is no bound"),
    (lambda d: d["metrics"].update(bound_method="lagrangian"), "metrics.lower_bound"),
    (lambda d: d["metrics"].update(gap=0.0), "metrics.gap"),
    (lambda d: d["metrics"].update(optimal=not d["metrics"]["optimal"]), "metrics.optimal"),
    (lambda d: d["metrics"].update(rank_perf=["fast", "faster"]), "rank_perf must list 2 numbers"),
])
def test_every_metric_is_checked_against_the_shards(demo, edit, expected):
    d = plan_to_dict(demo)
    edit(d)
    assert expected in refused(d)


def test_an_edit_below_six_digits_is_shown_with_the_digits_that_differ(demo):
    d = plan_to_dict(demo)
    perf = d["tables"][0]["est"]["perf"]
    d["tables"][0]["est"]["perf"] = float(f"{perf:.6g}")
    assert f"est says {float(f'{perf:.6g}')!r} ms" in (text := refused(d)) and f"its shards cost {perf!r} ms" in text


def test_a_users_own_placement_is_accepted_when_its_metrics_are_true(demo):
    forged = all_on_rank_0(plan_to_dict(demo))
    plan = plan_from_dict(forged)
    check_plan(plan)  # sound and true: a user may hand over such a plan; only the cache refuses it
    assert plan.metrics.critical_path > demo.metrics.critical_path * 1.5
    assert plan.metrics.rank_perf[1] == 0


# -- shards.parquet ---------------------------------------------------------------------------


def other_plan():
    inputs = ingest(str(DEMO), str(CPU_2PROC))
    return plan_spec(inputs.spec, inputs.topology, config=SearchConfig(time_limit_s=1.0))


def delete(d: Path) -> None:
    (d / "shards.parquet").unlink()


def truncate(d: Path) -> None:
    data = (d / "shards.parquet").read_bytes()
    (d / "shards.parquet").write_bytes(data[: len(data) // 2])


def foreign(d: Path) -> None:
    write_plan(other_plan(), d.parent / "other")
    shutil.copy(d.parent / "other" / "shards.parquet", d / "shards.parquet")


def edit_a_rank(d: Path) -> None:
    table = pq.read_table(d / "shards.parquet")
    ranks = table["rank"].to_pylist()
    ranks[0] = 1 - ranks[0]
    pq.write_table(table.set_column(5, "rank", pa.array(ranks, pa.int64())), d / "shards.parquet")


def drop_a_row(d: Path) -> None:
    table = pq.read_table(d / "shards.parquet")
    pq.write_table(table.slice(1), d / "shards.parquet")


SHARDS_CASES = {"deleted": (delete, "is missing"), "truncated": (truncate, "not a readable Parquet file"),
                "from another plan": (foreign, "belongs to plan"), "a rank edited": (edit_a_rank, "does not list"),
                "a row dropped": (drop_a_row, "has 7 rows, but plan")}


@pytest.mark.parametrize("case", list(SHARDS_CASES))
def test_a_bad_shards_parquet_next_to_a_good_plan_json_is_refused_in_one_line(demo, case, tmp_path, capsys):
    spoil, expected = SHARDS_CASES[case]
    d = tmp_path / "plan"
    write_plan(demo, d)
    spoil(d)
    for command in (["show", str(d)], ["train", "--plan", str(d), "--out", str(tmp_path / "train"),
                                        "--iterations", "3", "--warmup", "1", "--no-track"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        problems = [line for line in err.splitlines() if line.startswith("  - ")]
        assert len(problems) == 1 and "shards.parquet" in problems[0] and expected in problems[0], err
        assert "Traceback" not in err
    assert not (tmp_path / "train").exists()
    if case != "deleted":  # a plan.json named on its own is checked against the shards.parquet beside it
        with pytest.raises(InputError, match=r"shards\.parquet"):
            read_plan(d / "plan.json")


def test_a_shards_parquet_written_again_with_its_text_stored_otherwise_reads_as_it_was(demo, tmp_path):
    """Another writer (pandas, Spark) may store text as large_string or dictionary-encoded: the same shards."""
    write_plan(demo, tmp_path / "plan")
    table = pq.read_table(tmp_path / "plan" / "shards.parquet")
    for text in (pa.large_string(), pa.dictionary(pa.int32(), pa.string())):
        schema = pa.schema([pa.field(f.name, text if pa.types.is_string(f.type) else f.type) for f in table.schema])
        pq.write_table(table.cast(schema), tmp_path / "plan" / "shards.parquet")
        assert read_plan(tmp_path / "plan") == demo
    floats = table.set_column(5, "rank", table["rank"].cast(pa.float64()))
    pq.write_table(floats, tmp_path / "plan" / "shards.parquet")
    with pytest.raises(InputError, match="has columns of other types"):
        read_plan(tmp_path / "plan")


def test_a_plan_json_on_its_own_is_a_complete_plan(demo, tmp_path):
    write_plan(demo, tmp_path / "plan")
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(tmp_path / "plan" / "plan.json", alone / "plan.json")
    assert read_plan(alone / "plan.json") == demo
    with pytest.raises(InputError, match="is missing"):
        read_plan(alone)


def test_previous_plan_with_metrics_that_its_shards_do_not_give_is_refused(demo, tmp_path, capsys):
    edited = tmp_path / "edited"
    edited.mkdir()
    (edited / "plan.json").write_text(json.dumps(move_first_table(plan_to_dict(demo))))
    code = main(["plan", "--no-track", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "out"),
                 "--previous", str(edited / "plan.json")])
    err = capsys.readouterr().err
    assert code == 2 and "the previous plan" in err and "metrics.rank_perf says" in err, err
    assert not (tmp_path / "out").exists()


# -- writing a plan directory as a unit ----------------------------------------------------------


def test_a_plan_directory_keeps_only_the_new_plans_files(demo, tmp_path):
    out = tmp_path / "plan"
    replanned = replan_spec(issue2282_spec(9), demo.topology, plan_spec(issue2282_spec(8), demo.topology)).plan
    write_plan(replanned, out, extra=chart_of(replanned))
    (out / "notes.txt").write_text("the user's own")
    assert {"movement.parquet", "rank_load.png"} <= set(os.listdir(out))
    files = write_plan_files(demo, out)
    assert [f.name for f in files] == ["plan.json", "shards.parquet"]
    assert sorted(p for p in os.listdir(out) if not p.startswith(".")) == ["notes.txt", "plan.json", "shards.parquet"]
    assert read_plan(out) == demo


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EDQUOT, errno.EFBIG])
def test_a_write_out_of_space_names_the_place_and_leaves_the_earlier_plan(demo, tmp_path, code):
    out = tmp_path / "plan"
    write_plan(demo, out, extra=chart_of(demo))
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}

    def full(tmp: Path) -> None:
        raise OSError(code, os.strerror(code))

    with pytest.raises(OSError) as e:
        write_plan(other_plan(), out, extra=full)
    assert e.value.errno == code and e.value.filename == str(out)
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert [p.name for p in out.iterdir() if p.name.startswith(".tmp-plan-")] == []
