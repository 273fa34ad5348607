from __future__ import annotations

import subprocess

import pytest

from flows.cli import main
from rec.spec import read_spec
from rec.spec.synthetic import criteo_1tb_spec
from tests.paths import ROOT, SHARDFLOW, SPECS, TOPOLOGIES

BAD_SPEC = """\
tables:
- {name: a, num_embeddings: 10, embedding_dim: 4}
- {name: a, num_embeddings: 20, embedding_dim: 4}
- {name: b, num_embeddings: -3, embedding_dim: 4}
"""


def shardflow(*args: str) -> subprocess.CompletedProcess:
    """Run the installed console script, as a user would."""
    if not SHARDFLOW.exists():
        pytest.skip("console script not installed (pip install -e .)")
    return subprocess.run([str(SHARDFLOW), *args], capture_output=True, text=True, cwd=ROOT)


def test_validate_prints_table_count_and_hash(capsys):
    assert main(["spec", "validate", str(SPECS / "criteo_1tb.yaml")]) == 0
    assert capsys.readouterr().out == f"OK: 26 tables, hash {criteo_1tb_spec().spec_hash}\n"


def test_show_lists_every_table_with_sizes_and_totals(capsys):
    assert main(["spec", "show", str(SPECS / "cpu_demo.csv")]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == ["name", "rows", "dim", "data_type", "pooling", "pooling_factor", "bytes"]
    user_id = next(line for line in lines if line.startswith("user_id "))
    assert user_id.split() == ["user_id", "100,000", "64", "FP32", "SUM", "1", "24.4", "MiB"]
    spec = read_spec(SPECS / "cpu_demo.csv")
    assert f"{len(spec)} tables, 226,350 rows, 45.6 MiB of embedding weights" in out
    assert out.rstrip().endswith(f"spec hash: {spec.spec_hash}")


def test_show_columns_are_aligned(capsys):
    main(["spec", "show", str(SPECS / "criteo_1tb.yaml")])
    summary = capsys.readouterr().out.split("\n\n")[0].splitlines()
    assert len(summary) == 2 + 20 + 1 and summary[-1] == "... 6 more rows (--all shows every row)"
    main(["spec", "show", str(SPECS / "criteo_1tb.yaml"), "--all"])
    table = capsys.readouterr().out.split("\n\n")[0].splitlines()
    assert len(table) == 2 + 26 and table[2:22] == summary[2:22]
    rule = table[1]
    assert set(rule) == {"-", " "}
    assert len({len(line) for line in table[2:]}) == 1  # right-aligned bytes column ends every row together


def test_show_with_topology_compares_weights_with_memory(capsys):
    spec, topo = SPECS / "criteo_1tb.yaml", TOPOLOGIES / "h100_2x8.yaml"
    assert main(["spec", "show", str(spec), "--topology", str(topo)]) == 0
    out = capsys.readouterr().out
    assert "topology: 2 hosts x 8 cuda ranks, 68.0 GiB usable HBM per rank (15% of 80.0 GiB kept free)" in out
    assert "largest table t_cat_0 is 19.1 GiB (28.0% of one rank)" in out
    assert "topology hash: " in out


def test_show_on_cpu_topology_counts_ddr(capsys):
    spec, topo = SPECS / "cpu_demo.yaml", TOPOLOGIES / "cpu_2proc.yaml"
    assert main(["spec", "show", str(spec), "--topology", str(topo)]) == 0
    assert "1 host x 2 cpu ranks, 16.0 GiB usable DDR per rank" in capsys.readouterr().out


def test_bad_spec_reports_every_problem_and_exits_2(tmp_path, capsys):
    path = tmp_path / "bad.yaml"
    path.write_text(BAD_SPEC)
    assert main(["spec", "validate", str(path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "table 'a': duplicate name (rows 1 and 2)" in captured.err
    assert "table 'b': num_embeddings: must be > 0, got -3" in captured.err


def test_help_exits_0(capsys):
    assert main(["--help"]) == 0
    assert "spec" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["spec", "validate", "nope.parquet"], "nope.parquet: no such file"),
        (["spec", "validate", "README.txt"], "unsupported extension"),
        (["spec", "validate", "{bad}"], "table 'a': duplicate name"),
        (["spec", "show", "examples/specs/cpu_demo.yaml", "--topology", "nope.yaml"], "nope.yaml: no such file"),
        (["spec", "show", "examples/specs/cpu_demo.yaml", "--topology", "{bad_topo}"], "world_size: is required"),
        (["spec", "validate"], "the following arguments are required: SPEC"),
        (["spec", "frobnicate", "x"], "invalid choice: 'frobnicate'"),
        (["spec", "show", "x.yaml", "--colour"], "unrecognized arguments: --colour"),
        ([], "the following arguments are required: COMMAND"),
    ],
)
def test_user_mistakes_exit_2_with_a_one_screen_message(tmp_path, monkeypatch, capsys, args, expected):
    monkeypatch.chdir(ROOT)
    bad, bad_topo = tmp_path / "bad.yaml", tmp_path / "topo.yaml"
    bad.write_text(BAD_SPEC)
    bad_topo.write_text("compute_device: cuda\n")
    args = [a.replace("{bad}", str(bad)).replace("{bad_topo}", str(bad_topo)) for a in args]
    assert main(args) == 2  # an exception escaping main would fail the test: no traceback
    captured = capsys.readouterr()
    assert expected in captured.err
    assert len(captured.err.splitlines()) < 40
    assert captured.out == ""


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["spec", "validate", "nope.parquet"], "nope.parquet: no such file"),
        (["spec", "validate", "examples/specs/criteo_1tb.yaml", "--fast"], "unrecognized arguments: --fast"),
        (["spec", "validate", "{bad}"], "table 'b': num_embeddings: must be > 0, got -3"),
    ],
)
def test_installed_script_exits_2_without_traceback(tmp_path, args, expected):
    bad = tmp_path / "bad.yaml"
    bad.write_text(BAD_SPEC)
    done = shardflow(*(a.replace("{bad}", str(bad)) for a in args))
    assert done.returncode == 2
    assert expected in done.stderr
    assert "Traceback" not in done.stderr
    assert done.stdout == ""


def test_installed_script_validates_a_spec():
    done = shardflow("spec", "validate", "examples/specs/cpu_demo.csv")
    assert done.returncode == 0 and done.stdout.startswith("OK: 8 tables, hash ")
