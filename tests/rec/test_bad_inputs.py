"""Every bad input that reaches ingestion, through the real CLI: exit 2, one screen naming the problem,
no traceback, nothing written to --out.

Each case writes its files into a temporary directory and runs both ``shardflow spec validate SPEC``
(for spec cases) and ``shardflow plan SPEC --topology TOPO --out DIR``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flows.cli import main

CPU_TOPOLOGY = "world_size: 2\ncompute_device: cpu\nddr_cap: 16GiB\n"
CUDA_TOPOLOGY = "world_size: 8\ncompute_device: cuda\nhbm_cap: 80GiB\n"
GOOD_SPEC = "tables:\n- {name: users, num_embeddings: 1000, embedding_dim: 16}\n"
SCREEN_LINES = 40
ALLOWED_NAMES = "use ASCII letters, digits, '_' and '-'"


def table(**cells) -> str:
    """A one-table YAML spec; ``cells`` override a valid table."""
    row = {"name": "t", "num_embeddings": 100, "embedding_dim": 16, **cells}
    return "tables:\n- " + json.dumps(row) + "\n"


def json_table(cell: str) -> str:
    """A one-table JSON spec with one more cell written as raw JSON text (NaN, Infinity)."""
    return '[{"name": "t", "num_embeddings": 10, "embedding_dim": 16, ' + cell + "}]"


def parquet(path: Path, columns: dict) -> None:
    pq.write_table(pa.table(columns), path)


def parquet_table(path: Path, **columns) -> None:
    """A one-table Parquet spec; ``columns`` override a valid table."""
    parquet(path, {"name": ["t"], "num_embeddings": [10], "embedding_dim": [16], **columns})


def truncated_parquet(path: Path) -> None:
    parquet_table(path)
    path.write_bytes(path.read_bytes()[:-20])


def sparse_file(path: Path, size: int) -> None:
    path.touch()
    os.truncate(path, size)  # no disk blocks: the size is all that matters


def alias_bomb() -> str:
    lines = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 8)]
    return "\n".join(lines) + "\n"


# (id, spec file name, spec contents: text, bytes or a writer(path), expected text in the message)
SPEC_CASES: list[tuple[str, str, object, str]] = [
    # numbers the cost model cannot count exactly (int64 / float64) or that would allocate gigabytes
    ("rows 2^62 dim 16", "s.yaml", table(num_embeddings=2**62), "more than 2^42"),
    ("rows 2^58 dim 64", "s.yaml", table(num_embeddings=2**58, embedding_dim=64), "64-bit integers"),
    ("rows 2^63", "s.yaml", table(num_embeddings=2**63), "more than 2^42"),
    ("rows 1e40", "s.yaml", "tables:\n- {name: t, num_embeddings: 1e40, embedding_dim: 16}\n", "about 10^41 weights"),
    ("rows 10^40 int", "s.json", json.dumps({"tables": [{"name": "t", "num_embeddings": 10**40, "embedding_dim": 16}]}),
     "more than 2^42"),
    ("rows 5000 digits", "s.json", '[{"name": "t", "num_embeddings": ' + "9" * 5000 + ', "embedding_dim": 16}]',
     "not valid JSON"),
    ("dim 2^40", "s.yaml", table(embedding_dim=2**40), "embedding_dim: must be at most 65,536"),
    ("spec weights > 2^48", "s.yaml",
     "tables:\n" + "".join(f"- {{name: t{i}, num_embeddings: {2**36}, embedding_dim: 64}}\n" for i in range(65)),
     "weights in all"),
    ("ids per sample > 2^27", "s.yaml", table(pooling_factor=1e300), "ids per sample"),
    ("pooled width > 2^27", "s.yaml",
     table(embedding_dim=65536, feature_names=[f"f{i}" for i in range(2049)]), "values wide"),
    ("pooling_factor Infinity", "s.json", json_table('"pooling_factor": Infinity'),
     "must be a finite number > 0"),
    ("rows 0", "s.yaml", table(num_embeddings=0), "num_embeddings: must be > 0"),
    # NaN is not a default
    ("JSON NaN pooling_factor", "s.json", json_table('"pooling_factor": NaN'),
     "pooling_factor: got NaN (not a number)"),
    ("YAML .nan pooling_factor", "s.yaml", "- {name: t, num_embeddings: 10, embedding_dim: 16, pooling_factor: .nan}\n",
     "pooling_factor: got NaN"),
    ("CSV NaN pooling_factor", "s.csv", "name,num_embeddings,embedding_dim,pooling_factor\nt,10,16,NaN\n",
     "pooling_factor: got NaN"),
    ("JSON NaN num_embeddings", "s.json", '[{"name": "t", "num_embeddings": NaN, "embedding_dim": 16}]',
     "num_embeddings: expected a positive integer, got NaN (not a number)"),
    ("Parquet NaN pooling_factor", "s.parquet",
     lambda p: parquet_table(p, pooling_factor=[float("nan")]),
     "pooling_factor: got NaN"),
    # what TorchRec refuses
    ("dim 13", "s.yaml", table(embedding_dim=13), "embedding_dim 13 is not a multiple of 4"),
    ("dim 13 column_wise", "s.yaml", table(embedding_dim=13, sharding_types=["column_wise"]), "use 12 or 16"),
    ("dim 2", "s.yaml", table(embedding_dim=2), "use 4, or sharding_types: [data_parallel]"),
    ("name ../../etc/passwd", "s.yaml", table(name="../../etc/passwd"), ALLOWED_NAMES),
    ("name with a dot", "s.yaml", table(name="user.id"), "cannot contain '.'"),
    ("name starting with -", "s.yaml", table(name="-rf"), "not starting with '-'"),
    ("name 129 characters", "s.yaml", table(name="n" * 129), "at most 128"),
    ("name with a space", "s.csv", "name,num_embeddings,embedding_dim\nmy table,10,16\n", ALLOWED_NAMES),
    ("name with a terminal escape", "s.yaml", table(name="a\x1b[2Jb"), "a\\x1b[2Jb"),
    ("name of 1 MB", "s.yaml", table(name="n" * 2**20), "cannot be a table name"),
    ("name empty", "s.yaml", table(name=""), "name is required"),
    ("names duplicated", "s.yaml", table() + "- {name: t, num_embeddings: 5, embedding_dim: 8}\n", "duplicate name"),
    ("feature name with a tab", "s.yaml", table(feature_names=["a\tb"]), "control character"),
    ("feature listed 10^5 times", "s.yaml", table(feature_names=["f"] * 100_000), "'f' more than once"),
    # sharding types and kernels shardflow cannot plan
    ("grid_shard dim 256", "s.yaml", table(embedding_dim=256, sharding_types=["grid_shard"]),
     "grid_shard is not planned by shardflow; use table_row_wise, column_wise or table_column_wise"),
    ("grid_shard in Parquet", "s.parquet",
     lambda p: parquet_table(p, embedding_dim=[256], sharding_types=[["GRID_SHARD"]]),
     "grid_shard is not planned by shardflow"),
    ("key_value", "s.yaml", table(compute_kernels=["key_value"]), "key_value needs an SSD tier"),
    # the file itself
    ("missing file", "s.yaml", None, "no such file"),
    ("directory", "s.yaml", lambda p: p.mkdir(), "is a directory"),
    ("symlink loop", "s.yaml", lambda p: (p.with_name("b.yaml").symlink_to(p), p.symlink_to(p.with_name("b.yaml"))),
     "symbolic link loop"),
    ("broken symlink", "s.yaml", lambda p: p.symlink_to(p.with_name("gone.yaml")), "broken symbolic link"),
    ("/dev/zero", "s.yaml", lambda p: p.symlink_to("/dev/zero"), "not a regular file"),
    ("FIFO", "s.yaml", lambda p: os.mkfifo(p), "not a regular file"),
    ("2 GiB file", "s.yaml", lambda p: sparse_file(p, 2 * 2**30), "more than the 1.0 GiB"),
    ("unsupported extension", "s.txt", GOOD_SPEC, "unsupported extension"),
    ("empty YAML", "s.yaml", "", "the file is empty"),
    ("blank JSON", "s.json", "  \n", "the file is empty"),
    ("empty CSV", "s.csv", "", "the file is empty"),
    ("empty Parquet", "s.parquet", b"", "the file is empty"),
    ("CSV header only", "s.csv", "name,num_embeddings,embedding_dim\n", "the spec has no tables"),
    ("non-UTF-8 YAML", "s.yaml", b"tables:\n- {name: caf\xe9, num_embeddings: 1, embedding_dim: 4}\n", "not UTF-8"),
    ("non-UTF-8 JSON", "s.json", b'[{"name": "caf\xe9", "num_embeddings": 1, "embedding_dim": 4}]', "byte 0xe9"),
    ("non-UTF-8 CSV", "s.csv", b"name,num_embeddings,embedding_dim\ncaf\xe9,1,4\n", "line 2"),
    ("UTF-16 YAML", "s.yaml", GOOD_SPEC.encode("utf-16"), "not UTF-8"),
    # YAML and JSON as written by hand, or by an attacker
    ("YAML key twice", "s.yaml", "tables:\n- {name: t, num_embeddings: 10, embedding_dim: 16, embedding_dim: 32}\n",
     "the key 'embedding_dim' is written twice"),
    ("YAML block key twice", "s.yaml", "tables:\n- name: t\n  num_embeddings: 10\n  embedding_dim: 16\n  name: u\n",
     "the key 'name' is written twice"),
    ("JSON key twice", "s.json", '[{"name": "t", "name": "u", "num_embeddings": 10, "embedding_dim": 16}]',
     "the key 'name' is written twice"),
    ("YAML nested 10^5 deep", "s.yaml", "tables: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested more than 32"),
    ("JSON nested 10^5 deep", "s.json", "[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ("YAML billion laughs", "s.yaml",
     alias_bomb() + "tables: [{name: t, num_embeddings: 1, embedding_dim: 4, feature_names: *a7}]\n",
     "alias bomb"),
    ("YAML recursive alias", "s.yaml", "- &r {name: t, num_embeddings: 1, embedding_dim: 4, feature_names: [*r]}\n",
     "refers to a value that contains it"),
    ("YAML python tag", "s.yaml", "tables:\n- !!python/object/apply:os.system [echo hi]\n", "unsupported YAML tag"),
    ("YAML two documents", "s.yaml", GOOD_SPEC + "---\n" + GOOD_SPEC, "expected one YAML document"),
    ("YAML syntax", "s.yaml", "tables: [\n", "not valid YAML"),
    ("YAML scalar", "s.yaml", "42\n", "expected a list of tables"),
    ("YAML extra top-level key", "s.yaml", GOOD_SPEC + "owner: me\n", "unknown top-level keys: owner"),
    ("rows not mappings", "s.yaml", "- [t, 10, 16]\n", "row 1: expected a mapping"),
    ("unknown column", "s.yaml", table(num_embedings=5), "did you mean 'num_embeddings'"),
    ("a thousand bad rows", "s.yaml",
     "".join(f"- {{name: t{i}, num_embeddings: -1, embedding_dim: 16}}\n" for i in range(1000)),
     "and 997 more: num_embeddings: must be > 0, got -1"),
    ("a thousand different bad rows", "s.yaml",
     "".join(f"- {{name: t{i}, num_embeddings: -{i + 1}, embedding_dim: 16}}\n" for i in range(1000)),
     "... and 970 more problems"),
    # CSV
    ("CSV ragged row", "s.csv", "name,num_embeddings,embedding_dim\nt,10,16,extra\n", "not valid CSV"),
    ("CSV column twice", "s.csv", "name,name,num_embeddings,embedding_dim\nt,u,10,16\n", "appears more than once"),
    ("CSV quoted bad name", "s.csv", 'name,num_embeddings,embedding_dim\n"b ""q""",10,16\n', ALLOWED_NAMES),
    # Parquet and Arrow
    ("Parquet wrong types", "s.parquet",
     lambda p: parquet(p, {"name": ["t"], "num_embeddings": ["ten"], "embedding_dim": [[16]], "pooling_factor": ["x"]}),
     "num_embeddings: expected a positive integer, got 'ten'"),
    ("Parquet binary name", "s.parquet",
     lambda p: parquet(p, {"name": pa.array([b"\xff"], pa.binary()), "num_embeddings": [1], "embedding_dim": [4]}),
     "name: expected text"),
    ("Parquet uint64 rows", "s.parquet",
     lambda p: parquet(p, {"name": ["t"], "num_embeddings": pa.array([2**64 - 1], pa.uint64()), "embedding_dim": [16]}),
     "more than 2^42"),
    ("Parquet column twice", "s.parquet",
     lambda p: pq.write_table(pa.Table.from_arrays([pa.array(["t"]), pa.array(["u"]), pa.array([1]), pa.array([4])],
                                                   names=["name", "name", "num_embeddings", "embedding_dim"]), p),
     "appears more than once"),
    ("Parquet 2M rows", "s.parquet",
     lambda p: parquet(p, {"name": pa.DictionaryArray.from_arrays(np.zeros(2_000_000, np.int32), ["t"]),
                           "num_embeddings": np.ones(2_000_000, np.int64),
                           "embedding_dim": np.ones(2_000_000, np.int64)}),
     "more than 1,000,000"),
    ("Parquet dictionary bomb", "s.parquet",
     lambda p: parquet(p, {"name": pa.DictionaryArray.from_arrays([0] * 1100, ["x" * 2**20]),
                           "num_embeddings": [1] * 1100, "embedding_dim": [4] * 1100}),
     "once unpacked"),
    ("Parquet garbage", "s.parquet", "not parquet at all", "not valid Parquet"),
    ("Parquet truncated", "s.parquet",
     truncated_parquet,
     "not valid Parquet"),
    ("Arrow garbage", "s.arrow", "not arrow", "not valid Arrow"),
]

TOPOLOGY_CASES: list[tuple[str, object, str]] = [
    ("non-UTF-8", b"world_size: 2\ncompute_device: cpu\n# caf\xe9\n", "not UTF-8"),
    ("world_size 10^9", "world_size: 1000000000\ncompute_device: cuda\n", "world_size: must be at most 65,536"),
    ("world_size 2^16 + 1", "world_size: 65537\ncompute_device: cpu\n", "at most 65,536"),
    ("world_size true", "world_size: true\ncompute_device: cpu\n", "expected a positive integer"),
    ("key twice", "world_size: 2\nworld_size: 4\ncompute_device: cpu\n", "the key 'world_size' is written twice"),
    ("batch_size 10^9", CUDA_TOPOLOGY + "batch_size: 1000000000\n", "samples per step"),
    ("hbm_cap 1e999999999GB", CUDA_TOPOLOGY.replace("80GiB", "1e999999999GB"), "more bytes than any memory holds"),
    ("hbm_cap 2 PiB", CUDA_TOPOLOGY.replace("80GiB", "2PiB"), "at most 1.0 PiB per rank"),
    ("world x ddr_cap > 1 EiB", "world_size: 65536\ncompute_device: cpu\nddr_cap: 1PiB\n", "more than 1.0 EiB"),
    ("bandwidth 1e400GB/s", CUDA_TOPOLOGY + "intra_host_bw: 1e400GB/s\n", "intra_host_bw"),
    ("bandwidth 0.5 B/s", CUDA_TOPOLOGY + "inter_host_bw: 0.5\n", "must be between 1 and 1e+18 bytes/s"),
    ("storage_reservation NaN", CUDA_TOPOLOGY + "storage_reservation: .nan\n", "storage_reservation"),
    ("empty", "", "the file is empty"),
    ("a list", "- world_size: 8\n", "expected a mapping of keys"),
    ("a number key", CUDA_TOPOLOGY + "1: 2\n", "keys must be text"),
    ("compute_device a list", "world_size: 2\ncompute_device: [cpu]\n", "compute_device: expected one of cpu, cuda"),
    ("local_world_size > world_size", "world_size: 2\nlocal_world_size: 8\ncompute_device: cpu\n", "not a multiple"),
    ("nested 10^5 deep", "world_size: " + "[" * 100_000 + "]" * 100_000 + "\n", "nested more than 32"),
    ("alias bomb", alias_bomb() + "world_size: *a7\n", "alias bomb"),
    ("YAML syntax", "world_size: [\n", "not valid YAML"),
    ("typo", CUDA_TOPOLOGY + "hbm_capacity: 1GiB\n", "did you mean 'hbm_cap'"),
]


def write(path: Path, content: object) -> None:
    if content is None:
        return
    if isinstance(content, bytes):
        path.write_bytes(content)
    elif isinstance(content, str):
        path.write_text(content, encoding="utf-8")
    else:
        assert callable(content)
        content(path)


def plan_argv(spec: Path, topology: Path, out: Path) -> list[str]:
    return ["plan", str(spec), "--topology", str(topology), "--out", str(out)]


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)  # a traceback would escape here and fail the test
    captured = capsys.readouterr()
    return code, captured.err


def assert_clear_refusal(code: int, err: str, expected: str) -> None:
    assert code == 2, err
    assert expected in err, err
    assert "Traceback" not in err
    lines = err.rstrip("\n").splitlines()
    assert len(lines) <= SCREEN_LINES, f"{len(lines)} lines"
    assert all(len(line) <= 320 for line in lines), max(map(len, lines))
    assert "\x1b" not in err and "\r" not in err  # a terminal escape in a name is shown, not run


@pytest.mark.parametrize(("case", "name", "content", "expected"), SPEC_CASES, ids=[c[0] for c in SPEC_CASES])
def test_a_bad_spec_is_refused_clearly_by_validate_and_plan(tmp_path, capsys, case, name, content, expected):
    spec = tmp_path / name
    write(spec, content)
    topology = tmp_path / "topology.yaml"
    topology.write_text(CPU_TOPOLOGY)
    out = tmp_path / "out"

    assert_clear_refusal(*run_cli(["spec", "validate", str(spec)], capsys), expected)
    assert_clear_refusal(*run_cli(plan_argv(spec, topology, out), capsys), expected)
    assert not out.exists()


@pytest.mark.parametrize(("case", "content", "expected"), TOPOLOGY_CASES, ids=[c[0] for c in TOPOLOGY_CASES])
def test_a_bad_topology_is_refused_clearly_by_plan(tmp_path, capsys, case, content, expected):
    spec = tmp_path / "spec.yaml"
    spec.write_text(GOOD_SPEC)
    topology = tmp_path / "topology.yaml"
    write(topology, content)
    out = tmp_path / "out"

    assert_clear_refusal(*run_cli(plan_argv(spec, topology, out), capsys), expected)
    assert not out.exists()


def test_a_path_with_a_nul_character_is_refused_clearly(tmp_path, capsys):
    spec, topology = tmp_path / "spec.yaml", tmp_path / "topology.yaml"
    spec.write_text(GOOD_SPEC)
    topology.write_text(CPU_TOPOLOGY)
    out = tmp_path / "out"
    assert_clear_refusal(*run_cli(["plan", "a\0b.yaml", "--topology", str(topology), "--out", str(out)], capsys),
                         "contains a NUL character")
    assert_clear_refusal(*run_cli(["plan", str(spec), "--topology", "t\0.yaml", "--out", str(out)], capsys),
                         "contains a NUL character")
    assert not out.exists()


@pytest.mark.parametrize("what", ["spec", "topology"])
@pytest.mark.skipif(os.geteuid() == 0, reason="root reads any file")
def test_an_unreadable_file_is_refused_clearly(tmp_path, capsys, what):
    spec, topology = tmp_path / "spec.yaml", tmp_path / "topology.yaml"
    spec.write_text(GOOD_SPEC)
    topology.write_text(CPU_TOPOLOGY)
    (spec if what == "spec" else topology).chmod(0)
    out = tmp_path / "out"
    assert_clear_refusal(*run_cli(["plan", str(spec), "--topology", str(topology), "--out", str(out)], capsys),
                         "permission denied")
    assert not out.exists()


# What works must keep working: the refusals above are not broader than the problem.
VALID_CASES = [
        ("dim 13 replicated (dense kernel)", "s.yaml", table(embedding_dim=13, sharding_types=["data_parallel"])),
        ("dim 13 dense kernel", "s.yaml", table(embedding_dim=13, compute_kernels=["dense"])),
        ("names with - and _", "s.yaml", table(name="user-id_2")),
        ("feature names with dots and unicode", "s.yaml", table(feature_names=["user.age", "café"])),
        ("CSV with a UTF-8 BOM and quotes", "s.csv",
         '\ufeffname,num_embeddings,embedding_dim,feature_names\n"t",10,16,"a;b"\n'),
        ("YAML anchors and merge keys", "s.yaml",
         "tables:\n- &base {name: a, num_embeddings: 10, embedding_dim: 16, sharding_types: &st [table_wise]}\n"
         "- {<<: *base, name: b, feature_names: [b], sharding_types: *st}\n"),
        ("JSON with a BOM", "s.json", '\ufeff[{"name": "t", "num_embeddings": 10, "embedding_dim": 16}]'),
        ("rows 2^34 row_wise", "s.yaml", table(num_embeddings=2**34, embedding_dim=4, sharding_types=["row_wise"])),
]


@pytest.mark.parametrize(("case", "name", "content"), VALID_CASES, ids=[c[0] for c in VALID_CASES])
def test_unusual_but_valid_specs_still_plan(tmp_path, capsys, case, name, content):
    spec = tmp_path / name
    write(spec, content)
    topology = tmp_path / "topology.yaml"
    topology.write_text(CUDA_TOPOLOGY + "ddr_cap: 1TiB\n" if "row_wise" in str(content) else CPU_TOPOLOGY)
    out = tmp_path / "out"
    assert main(["spec", "validate", str(spec)]) == 0, capsys.readouterr().err
    assert main(["plan", "--no-track", str(spec), "--topology", str(topology), "--out",
                 str(out)]) == 0, capsys.readouterr().err
    assert (out / "plan.json").is_file()


def test_a_broken_json_topology_is_named_in_jsons_terms(tmp_path, capsys):
    """A .json file is read as YAML (JSON's superset); where it is broken, the error is JSON's own."""
    spec, topology = tmp_path / "spec.yaml", tmp_path / "topology.json"
    spec.write_text(GOOD_SPEC)
    topology.write_text('{"world_size": 2, "compute_device": "cpu"\n')
    out = tmp_path / "out"
    assert_clear_refusal(*run_cli(plan_argv(spec, topology, out), capsys), "not valid JSON")
    assert not out.exists()


def test_reading_a_small_spec_reserves_no_gigabyte(tmp_path):
    """Every spec, topology and plan read asked for its size limit (1 GiB) at once: under `ulimit -v 1000000`
    planning the 400-byte demo spec ended in a MemoryError."""
    import subprocess
    import sys
    import textwrap

    from tests.bytecode import without_bytecode
    from tests.paths import ROOT

    code = textwrap.dedent(f"""
        import resource
        from rec.spec import read_spec
        from rec.topology import read_topology
        resource.setrlimit(resource.RLIMIT_AS, (1_000_000_000, 1_000_000_000))
        print(len(read_spec({str(ROOT / 'examples/specs/cpu_demo.yaml')!r})),
              read_topology({str(ROOT / 'examples/topologies/cpu_2proc.yaml')!r}).world_size)
        """)
    env = without_bytecode({"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    r = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split()[1] == "2"


@pytest.mark.parametrize(("limits", "code"), [((16, 16), 2), ((16, 4096), 0)])
def test_too_few_open_files_are_raised_to_the_hard_limit_or_refused_in_one_line(tmp_path, limits, code):
    """Under `ulimit -n 16` Prefect's server spun on "too many open files" (800 MB of errors in 2 minutes);
    under 32 a training failed late, in torchrun. The soft limit is raised where the hard one allows."""
    import subprocess
    import sys
    import textwrap

    from tests.bytecode import without_bytecode
    from tests.paths import DEMO, ROOT

    run = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_NOFILE, {limits})
        from flows.cli import main
        sys.exit(main(["spec", "validate", {str(DEMO)!r}]))
        """)
    env = without_bytecode({"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    r = subprocess.run([sys.executable, "-c", run], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == code, r.stderr[-2000:]
    if code:
        assert r.stderr.splitlines() == ["shardflow: Too few open files allowed:",
                                         "  - ulimit -n: 16 (hard limit 16): shardflow needs at least 64; raise it "
                                         "(ulimit -n 1024)"]


def test_a_path_that_is_not_utf8_is_refused_before_the_search(tmp_path, capsys):
    """A file name of other bytes (or any non-ASCII one under LC_ALL=C with PYTHONUTF8=0): Arrow writes paths
    as UTF-8, and such a plan failed with a traceback after its search, leaving an empty folder."""
    from tests.paths import CPU_2PROC, DEMO

    out = str(tmp_path) + "/caf\udce9"  # the byte 0xe9, as Python keeps a name it cannot decode
    assert main(["plan", str(DEMO), "--topology", str(CPU_2PROC), "--out", out, "--no-track"]) == 2
    err = capsys.readouterr().err
    assert "Paths that are not UTF-8 text:" in err and "caf\\udce9 is not UTF-8 text" in err
    assert list(tmp_path.iterdir()) == []
