"""``shardflow plan``: a plan for good input; a one-screen error and exit 2 for bad input."""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import subprocess
import sys

import pytest

from flows.cli import main
from tests.paths import SPECS, TOPOLOGIES


def shardflow(*args: str) -> subprocess.CompletedProcess:
    """The command in this process (a new one would import the CLI again: a second each), what it
    printed on stdout and stderr captured (the tests of a command's own process are elsewhere)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(args))
    return subprocess.CompletedProcess(["shardflow", *args], code, out.getvalue(), err.getvalue())


def test_plan_writes_the_artifact_and_reports_quality(tmp_path):
    out = tmp_path / "plan"
    r = shardflow("plan", "--no-track", str(SPECS / "criteo_1tb.yaml"), "--topology",
                  str(TOPOLOGIES / "h100_2x8.yaml"), "--out", str(out))
    assert r.returncode == 0, r.stderr
    plan = json.loads((out / "plan.json").read_text())
    assert len(plan["tables"]) == 26
    assert (out / "shards.parquet").exists()
    for label in ("critical path:", "lower bound:", "gap", "time:", "search", plan["plan_id"]):
        assert label in r.stdout
    assert len([line for line in r.stdout.splitlines() if line.split()[:1] == ["15"]]) == 1  # 16 rank rows


def test_bad_spec_exits_2_naming_every_bad_table_and_writes_nothing(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("- {name: dup, num_embeddings: 10, embedding_dim: 4}\n"
                    "- {name: dup, num_embeddings: 10, embedding_dim: 4}\n"
                    "- {name: negative, num_embeddings: -5, embedding_dim: 4}\n")
    out = tmp_path / "plan"
    r = shardflow("plan", "--no-track", str(spec), "--topology", str(TOPOLOGIES / "h100_1x8.yaml"), "--out", str(out))
    assert r.returncode == 2
    assert "dup" in r.stderr and "negative" in r.stderr
    assert "Traceback" not in r.stderr
    assert len(r.stderr.splitlines()) < 25
    assert not out.exists()


def test_a_table_that_fits_nowhere_says_which_by_how_much_and_what_helps(tmp_path):
    spec = tmp_path / "huge.yaml"
    spec.write_text("- {name: ok, num_embeddings: 1000, embedding_dim: 64}\n"
                    "- {name: enormous, num_embeddings: 4000000000, embedding_dim: 512,"
                    " sharding_types: [table_wise], compute_kernels: [fused]}\n")
    r = shardflow("plan", "--no-track", str(spec), "--topology", str(TOPOLOGIES / "h100_1x8.yaml"),
                  "--out", str(tmp_path / "plan"))
    assert r.returncode == 2
    assert "table enormous" in r.stderr and "over by" in r.stderr
    assert "fused_uvm_caching" in r.stderr
    assert "table ok" not in r.stderr
    assert "Traceback" not in r.stderr


def topology_file(path, world_size: int, **keys: object):
    lines = [f"world_size: {world_size}", *(f"{key}: {value}" for key, value in keys.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.mark.parametrize("world_size", [2, 2048])
def test_a_table_whose_smallest_shard_exceeds_a_rank_gets_bigger_ranks_not_a_rank_count(tmp_path, world_size):
    """On cpu a table's shards (whole, by columns, replicated) never shrink as ranks are added: the
    hint names the memory a rank needs and says more ranks cannot help, on 2 ranks as on 2048."""
    spec = tmp_path / "big.yaml"
    spec.write_text("- {name: big, num_embeddings: 100000000, embedding_dim: 128}\n")
    topology = topology_file(tmp_path / "topology.yaml", world_size, local_world_size=min(world_size, 8),
                             compute_device="cpu", ddr_cap="1GiB")
    r = shardflow("plan", "--no-track", str(spec), "--topology", str(topology), "--out", str(tmp_path / "plan"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert "table big: does not fit" in r.stderr
    assert "more ranks of this size cannot hold it; it would fit on ranks with 48.1 GiB of usable DDR" in r.stderr
    assert "ranks of this size (" not in r.stderr and "at least" not in r.stderr  # no rank count at all


@pytest.mark.parametrize(("world_size", "rows", "hbm_cap"), [(2, 100_000_000, "1GiB"), (2048, 5_000_000_000, "1.5GiB")])
def test_the_rank_count_a_hint_names_fits_and_one_host_fewer_does_not(tmp_path, world_size, rows, hbm_cap):
    """Row-wise shards shrink as ranks are added: the hint names how many ranks of this size hold
    the table, and planning on that many succeeds while one host fewer still fails."""
    spec = tmp_path / "rows.yaml"
    spec.write_text(f"- {{name: rows, num_embeddings: {rows}, embedding_dim: 128}}\n")
    host = min(world_size, 8)
    keys = dict(local_world_size=host, compute_device="cuda", hbm_cap=hbm_cap, ddr_cap="1GiB")
    r = shardflow("plan", "--no-track", str(spec), "--topology", str(topology_file(tmp_path / "t.yaml", world_size,
                                                                                   **keys)),
                  "--out", str(tmp_path / "plan"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    found = re.search(r"it would fit on ([\d,]+) ranks of this size \(row_wise\)", r.stderr)
    assert found, r.stderr
    ranks = int(found.group(1).replace(",", ""))
    assert ranks > world_size and "cannot hold it" not in r.stderr
    for world, code in ((ranks, 0), (ranks - host, 2)):
        r = shardflow("plan", "--no-track", str(spec), "--topology", str(topology_file(tmp_path / f"t{world}.yaml",
                                                                                       world, **keys)),
                      "--out", str(tmp_path / f"plan{world}"), "--time-limit", "0")
        assert r.returncode == code, (world, r.stderr[-2000:])


def test_unknown_topology_file_is_a_user_error(tmp_path):
    r = shardflow("plan", "--no-track", str(SPECS / "cpu_demo.yaml"), "--topology", str(tmp_path / "nope.yaml"),
                  "--out", str(tmp_path / "plan"))
    assert r.returncode == 2
    assert "nope.yaml" in r.stderr and "Traceback" not in r.stderr


def test_a_topology_whose_reservation_leaves_no_memory_gets_one_clear_error(tmp_path):
    topo = tmp_path / "tiny.yaml"
    topo.write_text("world_size: 2\ncompute_device: cuda\nhbm_cap: 1MiB\nbatch_size: 100000\n")
    r = shardflow("plan", "--no-track", str(SPECS / "criteo_1tb.yaml"), "--topology", str(topo), "--out",
                  str(tmp_path / "p"))
    assert r.returncode == 2
    assert "no memory left" in r.stderr and "lower batch_size" in r.stderr
    assert "table " not in r.stderr and len(r.stderr.splitlines()) < 5


def test_plan_with_previous_moves_little_and_says_so(tmp_path):
    spec = SPECS / "criteo_1tb.yaml"
    topology = str(TOPOLOGIES / "h100_2x8.yaml")
    assert shardflow("plan", "--no-track", str(spec), "--topology", topology, "--out",
                     str(tmp_path / "a")).returncode == 0
    grown = tmp_path / "grown.yaml"
    grown.write_text(spec.read_text() + "- {name: added, num_embeddings: 5000, embedding_dim: 128}\n")
    r = shardflow("plan", "--no-track", str(grown), "--topology", topology, "--out", str(tmp_path / "b"),
                  "--previous", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    previous = json.loads((tmp_path / "a" / "plan.json").read_text())
    plan = json.loads((tmp_path / "b" / "plan.json").read_text())
    assert plan["previous_plan_id"] == previous["plan_id"] and plan["plan_id"] != previous["plan_id"]
    assert plan["metrics"]["movement"]["added_tables"] == 1
    assert "moved:" in r.stdout and f"from plan {previous['plan_id']}" in r.stdout
    assert (tmp_path / "b" / "movement.parquet").exists()


@pytest.mark.parametrize("case", ["other topology", "corrupt previous", "negative max-regress",
                                  "negative time limit", "absurd time limit", "no cache"])
def test_bad_previous_plans_and_knobs_exit_2(tmp_path, case):
    spec = str(SPECS / "criteo_1tb.yaml")
    assert shardflow("plan", "--no-track", spec, "--topology", str(TOPOLOGIES / "h100_1x8.yaml"), "--out",
                     str(tmp_path / "a")).returncode == 0
    args = ["--previous", str(tmp_path / "a")]
    if case == "corrupt previous":
        (tmp_path / "a" / "plan.json").write_text('{"format": "shardflow.plan/v2", "tables": [')
    if case == "negative max-regress":
        args += ["--max-regress", "-1"]
    if case.endswith("time limit"):
        args = ["--time-limit", "-5" if case.startswith("negative") else "1e9"]
    if case == "no cache":
        args = ["--caching-ratio", "0"]
    topology = "h100_2x8.yaml" if case == "other topology" else "h100_1x8.yaml"
    r = shardflow("plan", "--no-track", spec, "--topology", str(TOPOLOGIES / topology), "--out",
                  str(tmp_path / "b"), *args)
    assert r.returncode == 2, r.stdout + r.stderr
    assert "Traceback" not in r.stderr and len(r.stderr.splitlines()) < 25
    assert {"other topology": "another topology", "corrupt previous": "not valid JSON",
            "negative max-regress": "--max-regress", "negative time limit": "--time-limit: must be at least 0",
            "absurd time limit": "--time-limit: must be at most 86400",
            "no cache": "--caching-ratio: must be above 0"}[case] in r.stderr
    assert not (tmp_path / "b").exists()


def test_a_plan_whose_uvm_tables_fbgemm_keeps_more_of_in_hbm_than_planned_says_so_in_one_line(tmp_path, capsys):
    """One rank, caches of 16-column tables beside 128-column ones in one kernel group: FBGEMM makes
    every cache row 128 columns wide, past the HBM the plan counted. Tables of one width: FBGEMM's own
    int64 pair per cache slot and int32 per row of the tables, which TorchRec's estimate leaves out.
    A rowwise optimizer keeps every row's state of a cached table in HBM, not the load factor's share."""
    from flows.reports import render_plan
    from rec.analysis.fbgemm_caches import cache_hbm
    from rec.config.cost import CostConfig, Optimizer
    from rec.plan.io import write_plan
    from rec.planning import plan_spec
    from rec.spec import spec_from_rows
    from rec.topology import topology_from_dict

    topology = topology_from_dict({"world_size": 1, "local_world_size": 1, "compute_device": "cuda",
                                   "hbm_cap": 2**30, "batch_size": 512})
    rows = [10_000_000 + 100_000 * i for i in range(4)]

    def planned(dims, optimizer):
        spec = spec_from_rows([{"name": f"t{i}", "num_embeddings": n, "embedding_dim": d, "pooling_factor": 4.0,
                                "sharding_types": ["table_wise"]}
                               for i, (n, d) in enumerate(zip(rows, dims, strict=True))])
        plan = plan_spec(spec, topology, CostConfig(optimizer=optimizer))
        assert all(t.compute_kernel.value == "fused_uvm_caching" for t in plan.tables)
        factors = [t.cache_load_factor or 0.2 for t in sorted(plan.tables, key=lambda t: t.name)]
        lines = [line for line in render_plan(plan).splitlines() if line.startswith("caches:")]
        return plan, cache_hbm(plan), factors, lines

    def fbgemm_own(factors):  # beside each cached row, its slot's two int64s; an int32 per row of the tables
        return sum(f * n for f, n in zip(factors, rows, strict=True)) * 16 + sum(rows) * 4

    _, caches, factors, lines = planned((64, 64, 64, 64), Optimizer.SGD)
    assert caches.built[0] == pytest.approx(caches.planned[0] + fbgemm_own(factors), rel=1e-4)  # one width, no state
    assert [line.split(":")[1].strip()[:42] for line in lines] == ["FBGEMM keeps more of the uvm tables in HBM"]
    plan, caches, factors, lines = planned((16, 16, 128, 128), Optimizer.SGD)
    cached = sum(f * n for f, n in zip(factors, rows, strict=True))
    assert caches.built[0] == pytest.approx(cached * 128 * 4 + fbgemm_own(factors), rel=1e-4)  # each row 128 wide
    (line,) = lines
    assert "past the usable HBM on rank 0: " in line and "planned" in line and "docs/gpu.md" in line
    write_plan(plan, tmp_path / "plan")
    capsys.readouterr()
    assert main(["show", str(tmp_path / "plan")]) == 0
    assert line in capsys.readouterr().out.splitlines()
    _, caches, factors, _ = planned((64, 64, 64, 64), Optimizer.ROWWISE_ADAGRAD)
    state = sum((1 - f) * n * 4 for f, n in zip(factors, rows, strict=True))  # every row's, not f's share
    assert caches.built[0] - caches.planned[0] == pytest.approx(state + fbgemm_own(factors), rel=1e-3)


def test_an_empty_path_as_an_unset_shell_variable_gives_is_refused_not_the_working_directory(tmp_path, capsys):
    from flows.cli import main

    code = main(["plan", "--no-track", str(SPECS / "criteo_1tb.yaml"), "--topology", "", "--out", ""])
    assert code == 2 and list(tmp_path.iterdir()) == []
    err = capsys.readouterr().err
    assert "--out, --topology: is empty: name a file or directory" in err


@pytest.mark.parametrize("in_the_way", ["rank_load.png", "plan.json"])
def test_a_directory_where_a_plan_file_goes_fails_the_write_and_leaves_the_earlier_plan_whole(tmp_path, in_the_way):
    """A directory in the way of one of the plan's files is named before anything changes: the plan
    already there still reads (its shards.parquet is not the new plan's), and nothing half-written stays."""
    out = tmp_path / "plan"
    first = shardflow("plan", "--no-track", "--no-chart", str(SPECS / "cpu_demo.yaml"), "--topology",
                      str(TOPOLOGIES / "cpu_2proc.yaml"), "--out", str(out))
    assert first.returncode == 0, first.stderr
    before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
    if in_the_way == "plan.json":
        (out / "plan.json").unlink()
        del before["plan.json"]
    (out / in_the_way).mkdir()
    r = shardflow("plan", "--no-track", str(SPECS / "cpu_demo.yaml"), "--topology", str(TOPOLOGIES / "cpu_2proc.yaml"),
                  "--caching-ratio", "0.3", "--shard-limits", "2", "--out", str(out))
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [f"shardflow: cannot use {out / in_the_way}: Is a directory"]
    assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
    assert sorted(p.name for p in out.iterdir() if p.is_dir()) == [in_the_way]


def test_bad_settings_a_bad_profile_spec_and_topology_are_named_in_one_run(tmp_path):
    """Where each once hid the ones after it (a bad --caching-ratio hid a spec's fourteen problems)."""
    (tmp_path / "bad.yaml").write_text("- {name: dup, num_embeddings: -5, embedding_dim: 4}\n")
    (tmp_path / "topology.yaml").write_text("world_size: 0\ncompute_device: cuda\n")
    (tmp_path / "profile.yaml").write_text("coefficients: {nope: 1}\n")
    r = shardflow("plan", "--no-track", str(tmp_path / "bad.yaml"), "--topology", str(tmp_path / "topology.yaml"),
                  "--caching-ratio", "2", "--profile", str(tmp_path / "profile.yaml"), "--out", str(tmp_path / "plan"))
    assert r.returncode == 2 and "Traceback" not in r.stderr
    for named in ("coefficients.nope: unknown key", "--caching-ratio: must be at most 1", "num_embeddings: must be > 0",
                  "world_size: must be > 0"):
        assert named in r.stderr, r.stderr
    assert not (tmp_path / "plan").exists()


def test_a_link_in_place_of_the_outbox_or_plan_cache_is_refused_before_anything_is_planned(tmp_path, capsys):
    """shardflow once followed them: its outbox entries, cached plans and a new secret key went to
    the folders linked to."""
    from tests.paths import CPU_2PROC, DEMO

    elsewhere, state = tmp_path / "elsewhere", tmp_path / "state"
    elsewhere.mkdir()
    state.mkdir()
    (state / "outbox").symlink_to(elsewhere)
    (state / "plan-cache").symlink_to(elsewhere)
    code = main(["plan", str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "p"), "--state-dir",
                 str(state), "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("is a symbolic link, not a folder: shardflow follows no link") == 1, err
    assert f"{state / 'outbox'}, {state / 'plan-cache'}:" in err
    assert list(elsewhere.iterdir()) == [] and not (tmp_path / "p").exists()


@pytest.mark.parametrize("command", ["run", "replan"])
def test_run_and_replan_into_a_file_exit_2_before_prefect_starts(tmp_path, capsys, command):
    """Inside a flow, the folders failed with Prefect's tracebacks, after Prefect had started."""
    from tests.paths import CPU_2PROC, DEMO

    (tmp_path / "file").write_text("mine\n")
    code = main([command, str(DEMO), "--topology", str(CPU_2PROC), "--out", str(tmp_path / "file"),
                 "--state-dir", str(tmp_path / "file" / "state"), "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}"])
    captured = capsys.readouterr()
    assert code == 2 and "Traceback" not in captured.err and captured.out == ""
    assert f"--out: {tmp_path / 'file'}: {tmp_path / 'file'} is a file, not a folder" in captured.err
    assert f"--state-dir: {tmp_path / 'file' / 'state'}: {tmp_path / 'file'} is a file" in captured.err
    assert (tmp_path / "file").read_text() == "mine\n"


def test_the_same_spec_gives_the_same_plan_in_every_process(tmp_path):
    """Python salts string hashes anew in each process: a search that walked a set of names would
    plan another way in each (a probe's workload generator did). Memory decides here, so the
    cache-size pass runs too."""
    topology = topology_file(tmp_path / "t.yaml", 4, local_world_size=4, compute_device="cuda", hbm_cap="24GiB")
    ids = set()
    for seed in ("1", "2"):
        out = tmp_path / f"plan-{seed}"
        r = subprocess.run([sys.executable, "-m", "flows.cli", "plan", "--no-track", "--no-chart", "--time-limit", "2",
                            str(SPECS / "criteo_1tb.yaml"), "--topology", str(topology), "--out", str(out)],
                           capture_output=True, text=True, env={**os.environ, "PYTHONHASHSEED": seed}, timeout=120)
        assert r.returncode == 0, r.stderr
        plan = json.loads((out / "plan.json").read_text())
        assert any(t.get("cache_load_factor") for t in plan["tables"])  # memory decides: caches sized
        ids.add(plan["plan_id"])
    assert len(ids) == 1
