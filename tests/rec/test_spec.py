from __future__ import annotations

import functools
import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rec.documents import DocumentError, load_json, load_yaml
from rec.errors import InputError
from rec.sharding import ComputeKernel, DataType, Pooling, ShardingType
from rec.spec import Spec, read_spec, spec_from_rows, write_spec
from rec.spec.columnar import columnar_spec
from rec.spec.synthetic import mixed_spec
from tests.paths import ROOT

EXTENSIONS = [".parquet", ".pq", ".arrow", ".feather", ".ipc", ".csv", ".yaml", ".yml", ".json"]

ROWS = [
    {"name": "users", "num_embeddings": 1000, "embedding_dim": 16},
    {
        "name": "item_ids",
        "num_embeddings": 5000,
        "embedding_dim": 32,
        "feature_names": ["item", "clicked_item"],
        "pooling": "MEAN",
        "data_type": "FP16",
        "pooling_factor": 7.5,
        "sharding_types": ["row_wise", "table_wise"],
        "compute_kernels": ["fused"],
    },
    {"name": "country", "num_embeddings": 200, "embedding_dim": 8, "pooling_factor": 2},
]


def problems_of(rows: list) -> InputError:
    with pytest.raises(InputError) as caught:
        spec_from_rows(rows)
    return caught.value


def write_text(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


# -- reading and defaults ----------------------------------------------------------------------


def test_defaults_fill_absent_columns():
    users = spec_from_rows(ROWS).tables[0]
    assert users.feature_names == ("users",)
    assert users.pooling is Pooling.SUM
    assert users.data_type is DataType.FP32
    assert users.pooling_factor == 1.0
    assert users.sharding_types is None and users.compute_kernels is None


def test_values_are_typed_and_allow_lists_kept():
    items = spec_from_rows(ROWS).tables[1]
    assert items.feature_names == ("item", "clicked_item")
    assert items.pooling is Pooling.MEAN
    assert items.data_type is DataType.FP16
    assert items.sharding_types == (ShardingType.TABLE_WISE, ShardingType.ROW_WISE)
    assert items.compute_kernels == (ComputeKernel.FUSED,)
    assert items.bytes == 5000 * 32 * 2


def test_tables_keep_the_order_they_were_written_in():
    assert spec_from_rows(ROWS).names == ["users", "item_ids", "country"]


@pytest.mark.parametrize("ext", EXTENSIONS)
def test_every_format_round_trips_to_the_same_spec_and_hash(tmp_path, ext):
    spec = spec_from_rows(ROWS)
    back = read_spec(write_spec(spec, tmp_path / f"spec{ext}"))
    assert back == spec


def test_large_heterogeneous_spec_round_trips_through_every_format(tmp_path):
    spec = mixed_spec()
    hashes = {ext: read_spec(write_spec(spec, tmp_path / f"s{ext}")).spec_hash for ext in EXTENSIONS}
    assert set(hashes.values()) == {spec.spec_hash}


def test_hash_ignores_row_order_but_not_content():
    shuffled = ROWS[:]
    random.Random(1).shuffle(shuffled)
    assert spec_from_rows(shuffled).spec_hash == spec_from_rows(ROWS).spec_hash
    changed = [dict(ROWS[0], embedding_dim=20), *ROWS[1:]]
    assert spec_from_rows(changed).spec_hash != spec_from_rows(ROWS).spec_hash


def test_hash_ignores_how_a_value_was_spelled():
    spelled = [
        dict(ROWS[1], sharding_types="TABLE_WISE;row_wise", pooling="mean", data_type="fp16",
             compute_kernels=["FUSED"]),
        dict(ROWS[0], num_embeddings="1000", feature_names=["users"], pooling_factor=1),
        ROWS[2],
    ]
    assert spec_from_rows(spelled).spec_hash == spec_from_rows(ROWS).spec_hash


def test_hash_is_16_hex_digits():
    digest = spec_from_rows(ROWS).spec_hash
    assert len(digest) == 16 and int(digest, 16) >= 0


def test_csv_lists_are_semicolon_separated_and_empty_cells_mean_default(tmp_path):
    path = write_text(
        tmp_path,
        "spec.csv",
        "name,num_embeddings,embedding_dim,feature_names,pooling,pooling_factor,sharding_types\n"
        "a,100,8,a1;a2,,,\n"
        "b,200,16,,MEAN,2.5,table_wise; row_wise\n",
    )
    a, b = read_spec(path).tables
    assert a.feature_names == ("a1", "a2") and a.pooling is Pooling.SUM and a.pooling_factor == 1.0
    assert b.feature_names == ("b",) and b.pooling_factor == 2.5
    assert b.sharding_types == (ShardingType.TABLE_WISE, ShardingType.ROW_WISE)


def test_parquet_nulls_in_optional_columns_mean_default(tmp_path):
    table = pa.table(
        {
            "name": ["a", "b"],
            "num_embeddings": [10, 20],
            "embedding_dim": [4, 8],
            "feature_names": pa.array([None, ["f"]], type=pa.list_(pa.string())),
            "pooling_factor": pa.array([None, 3.0]),
            "data_type": pa.array([None, "INT8"]),
        }
    )
    pq.write_table(table, tmp_path / "spec.parquet")
    a, b = read_spec(tmp_path / "spec.parquet").tables
    assert (a.feature_names, a.pooling_factor, a.data_type) == (("a",), 1.0, DataType.FP32)
    assert (b.feature_names, b.pooling_factor, b.data_type) == (("f",), 3.0, DataType.INT8)


def test_parquet_decimal_columns_are_read_as_the_numbers_they_hold(tmp_path):
    """A warehouse's NUMERIC columns (Spark's DecimalType): the same spec as plain numbers, and a value
    beyond int64 named as too large."""
    from decimal import Decimal

    plain = pa.table({"name": ["a", "b"], "num_embeddings": [1000, 20_000], "embedding_dim": [8, 16],
                      "pooling_factor": [1.5, 2.0], "min_cache_load_factor": [0.25, None]})
    decimal = plain.set_column(1, "num_embeddings", plain["num_embeddings"].cast(pa.decimal128(20, 0)))
    decimal = decimal.set_column(3, "pooling_factor", plain["pooling_factor"].cast(pa.decimal128(10, 2)))
    decimal = decimal.set_column(4, "min_cache_load_factor", plain["min_cache_load_factor"].cast(pa.decimal128(4, 3)))
    for name, t in (("plain", plain), ("decimal", decimal)):
        pq.write_table(t, tmp_path / f"{name}.parquet")
    assert read_spec(tmp_path / "decimal.parquet") == read_spec(tmp_path / "plain.parquet")
    huge = plain.set_column(1, "num_embeddings", pa.array([Decimal(10**30), Decimal(1000)], pa.decimal128(38, 0)))
    pq.write_table(huge, tmp_path / "huge.parquet")
    with pytest.raises(InputError) as e:
        read_spec(tmp_path / "huge.parquet")
    assert [p.where for p in e.value.problems] == ["table 'a'"]
    assert "num_embeddings" in e.value.problems[0].reason


def test_yaml_accepts_a_plain_list_and_scientific_row_counts(tmp_path):
    path = write_text(tmp_path, "spec.yaml", "- {name: a, num_embeddings: 1e6, embedding_dim: 8}\n")
    assert read_spec(path).tables[0].num_embeddings == 1_000_000


def test_json_accepts_a_tables_mapping(tmp_path):
    path = write_text(tmp_path, "spec.json", '{"tables": [{"name": "a", "num_embeddings": 3, "embedding_dim": 4}]}')
    assert read_spec(path).names == ["a"]


# -- bad input: every problem names the table (or row) and the reason ---------------------------


@pytest.mark.parametrize(
    ("row", "expected"),
    [
        ({"num_embeddings": "abc"}, "num_embeddings: expected a positive integer, got 'abc'"),
        ({"num_embeddings": 1.5}, "num_embeddings: expected a positive integer, got 1.5"),
        ({"num_embeddings": -5}, "num_embeddings: must be > 0, got -5"),
        ({"num_embeddings": True}, "num_embeddings: expected a positive integer"),
        ({"embedding_dim": 0}, "embedding_dim: must be > 0, got 0"),
        ({"pooling_factor": 0}, "pooling_factor: must be a finite number > 0"),
        ({"pooling_factor": "many"}, "pooling_factor: expected a positive number"),
        ({"pooling": "MAX"}, "pooling: unknown pooling 'MAX' (known: SUM, MEAN, NONE)"),
        ({"data_type": "FP64"}, "data_type: unknown data type 'FP64'"),
        ({"sharding_types": ["table_wise", "diagonal"]}, "sharding_types: unknown sharding type 'diagonal'"),
        ({"compute_kernels": "fused;turbo"}, "compute_kernels: unknown compute kernel 'turbo'"),
        ({"feature_names": ["x", "x"]}, "feature_names: lists 'x' more than once"),
        ({"feature_names": []}, "feature_names: must not be empty"),
        ({"feature_names": [1, 2]}, "feature_names: expected a list of text"),
    ],
)
def test_each_bad_value_is_reported_with_its_table_and_reason(row, expected):
    error = problems_of([{"name": "clicks", "num_embeddings": 10, "embedding_dim": 4, **row}])
    assert len(error.problems) == 1
    assert str(error.problems[0]).startswith(f"table 'clicks': {expected}")


def test_a_missing_name_is_reported_by_row_number():
    error = problems_of([ROWS[0], {"num_embeddings": 10, "embedding_dim": 4}])
    assert [str(p) for p in error.problems] == ["row 2: name is required"]


def test_a_missing_required_value_names_the_table():
    error = problems_of([ROWS[0], {"name": "b", "embedding_dim": 4}])
    assert [str(p) for p in error.problems] == ["table 'b': num_embeddings is required"]


def test_all_problems_are_reported_together():
    rows = [
        {"name": "a", "num_embeddings": 10, "embedding_dim": 4},
        {"name": "a", "num_embeddings": 20, "embedding_dim": "wide"},
        {"name": "b", "num_embeddings": -1, "embedding_dim": 4},
        {"name": "c", "num_embeddings": 10, "embedding_dim": 4, "feature_names": ["a"]},
    ]
    error = problems_of(rows)
    text = error.render()
    assert "table 'a': duplicate name (rows 1 and 2)" in text
    assert "table 'a': embedding_dim: expected a positive integer, got 'wide'" in text
    assert "table 'b': num_embeddings: must be > 0, got -1" in text
    assert "table 'c': feature 'a' is also used by table 'a'" in text
    assert len(error.problems) == 4
    assert text.startswith("Invalid spec: 4 problems")


def test_unknown_columns_are_errors_with_a_suggestion():
    error = problems_of([{"name": "a", "num_embedings": 10, "embedding_dim": 4}])
    text = error.render()
    assert "column 'num_embedings': unknown column; did you mean 'num_embeddings'?" in text
    assert "column 'num_embeddings': required column is missing" in text


def test_unknown_column_in_some_rows_names_those_tables():
    error = problems_of([ROWS[0], dict(ROWS[2], owner="me")])
    assert str(error.problems[0]).startswith("column 'owner': unknown column in table 'country';")


def test_required_column_absent_from_a_file_is_reported_once(tmp_path):
    path = write_text(tmp_path, "spec.csv", "name,embedding_dim\na,4\nb,8\nc,8\n")
    with pytest.raises(InputError) as caught:
        read_spec(path)
    assert [str(p) for p in caught.value.problems] == ["column 'num_embeddings': required column is missing"]


def test_a_non_mapping_entry_is_reported_by_row_number():
    error = problems_of([ROWS[0], ["b", 10, 4]])
    assert str(error.problems[0]).startswith("row 2: expected a mapping")


def test_a_non_text_name_is_reported():
    error = problems_of([{"name": 7, "num_embeddings": 10, "embedding_dim": 4}])
    assert str(error.problems[0]) == "row 1: name: expected text, got 7"


@pytest.mark.parametrize(
    ("name", "text"),
    [("empty.yaml", "tables: []\n"), ("empty.csv", "name,num_embeddings,embedding_dim\n"), ("blank.yaml", "")],
)
def test_an_empty_spec_is_an_error(tmp_path, name, text):
    with pytest.raises(InputError, match="the spec has no tables"):
        read_spec(write_text(tmp_path, name, text))


def test_a_missing_file_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_spec(tmp_path / "nope.parquet")


def test_a_directory_is_an_input_error(tmp_path):
    (tmp_path / "d.yaml").mkdir()
    with pytest.raises(InputError, match="is a directory"):
        read_spec(tmp_path / "d.yaml")


def test_an_unsupported_extension_is_an_input_error(tmp_path):
    with pytest.raises(InputError, match=r"unsupported extension \(use one of .arrow, .csv"):
        read_spec(write_text(tmp_path, "spec.txt", "x"))
    with pytest.raises(InputError, match="unsupported extension"):
        write_spec(spec_from_rows(ROWS), tmp_path / "spec.xlsx")


@pytest.mark.parametrize(
    ("name", "text", "expected"),
    [
        ("bad.yaml", "tables: [\n", "not valid YAML"),
        ("bad.json", "{", "not valid JSON"),
        ("bad.parquet", "not parquet", "not valid Parquet"),
        ("bad.feather", "not arrow", "not valid Arrow"),
        ("odd.yaml", "tables: []\nowner: me\n", "unknown top-level keys: owner"),
        ("odd.json", "42", "expected a list of tables or a 'tables:' key, got int"),
    ],
)
def test_malformed_files_are_input_errors(tmp_path, name, text, expected):
    with pytest.raises(InputError, match=expected):
        read_spec(write_text(tmp_path, name, text))


def test_spec_is_a_frozen_value():
    spec = spec_from_rows(ROWS)
    assert isinstance(spec, Spec) and len(spec) == 3
    with pytest.raises(AttributeError):
        spec.tables[0].num_embeddings = 1


# -- what TorchRec can build and the cost model can count (rec.spec.limits) --------------------


def one_table(**cells) -> list[dict]:
    return [{"name": "t", "num_embeddings": 10, "embedding_dim": 16, **cells}]


@pytest.mark.parametrize(
    ("cells", "ok"),
    [
        ({"num_embeddings": 2**38, "embedding_dim": 16}, True),  # exactly 2^42 weights
        ({"num_embeddings": 2**38 + 1, "embedding_dim": 16}, False),
        ({"embedding_dim": 65_536}, True),
        ({"embedding_dim": 65_540}, False),
        ({"embedding_dim": 12}, True),
        ({"embedding_dim": 14}, False),
        ({"embedding_dim": 14, "sharding_types": ["data_parallel"]}, True),
        ({"embedding_dim": 14, "compute_kernels": ["dense"]}, True),
        ({"embedding_dim": 14, "sharding_types": ["data_parallel", "table_wise"]}, False),
        ({"name": "a" * 128}, True),
        ({"name": "a" * 129}, False),
        ({"name": "_x-1"}, True),
        ({"name": "x/y"}, False),
        ({"name": "é"}, False),
    ],
)
def test_table_bounds_are_exact(cells, ok):
    if ok:
        assert spec_from_rows(one_table(**cells))
    else:
        with pytest.raises(InputError):
            spec_from_rows(one_table(**cells))


def test_spec_totals_are_bounded_without_repeating_a_table_problem():
    rows = [{"name": f"t{i}", "num_embeddings": 2**36, "embedding_dim": 64} for i in range(65)]
    assert [p.where for p in problems_of(rows).problems] == ["spec"]  # 65 x 2^42 > 2^48 weights
    assert spec_from_rows(rows[:64])
    error = problems_of(one_table(num_embeddings=2**62))
    assert len(error.problems) == 1 and "more than 2^42" in error.problems[0].reason


def test_nan_is_an_error_not_a_default_but_null_and_empty_cells_are_defaults():
    assert "NaN (not a number)" in str(problems_of(one_table(pooling_factor=float("nan"))))
    assert "NaN (not a number)" in str(problems_of(one_table(num_embeddings="nan")))
    assert spec_from_rows(one_table(pooling_factor=None, pooling="  ")).tables[0].pooling_factor == 1.0


def test_grid_shard_and_key_value_are_refused_with_the_alternatives():
    text = str(problems_of(one_table(embedding_dim=256, sharding_types=["table_wise", "grid_shard"])))
    assert "grid_shard is not planned by shardflow; use table_row_wise, column_wise" in text
    assert "fused_uvm_caching or fused_uvm" in str(problems_of(one_table(compute_kernels="key_value")))


def test_spec_validation_refuses_what_torchrec_refuses_and_accepts_what_it_builds(single_process_group):
    """The oracle is TorchRec: build each table with DistributedModelParallel on one cpu process."""
    torch = pytest.importorskip("torch")
    pytest.importorskip("torchrec")
    import torch.distributed as dist
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.model_parallel import DistributedModelParallel
    from torchrec.distributed.planner import EmbeddingShardingPlanner, ParameterConstraints, Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection
    from torchrec.sparse.jagged_tensor import KeyedJaggedTensor

    def torchrec_builds(name: str, dim: int, sharding_type: str) -> bool:
        try:
            config = EmbeddingBagConfig(name=name, num_embeddings=10, embedding_dim=dim, feature_names=["f"])
            ebc = EmbeddingBagCollection(tables=[config], device=torch.device("meta"))
            planner = EmbeddingShardingPlanner(
                topology=Topology(world_size=1, compute_device="cpu"),
                constraints={name: ParameterConstraints(sharding_types=[sharding_type])},
            )
            sharders = [EmbeddingBagCollectionSharder()]
            plan = planner.collective_plan(ebc, sharders, dist.GroupMember.WORLD)
            model = DistributedModelParallel(ebc, device=torch.device("cpu"), plan=plan, sharders=sharders)
            kjt = KeyedJaggedTensor.from_lengths_sync(keys=["f"], values=torch.tensor([1, 2]),
                                                      lengths=torch.tensor([1, 1]))
            model(kjt).to_dict()["f"].sum().backward()
            return True
        except (AssertionError, KeyError):  # "local_cols=13 not divisible by 4", "module name can't contain '.'"
            return False

    def shardflow_accepts(name: str, dim: int, sharding_type: str) -> bool:
        try:
            spec_from_rows(one_table(name=name, embedding_dim=dim, sharding_types=[sharding_type]))
            return True
        except InputError:
            return False

    cases = [("t", 13, "table_wise"), ("t", 13, "data_parallel"), ("t", 12, "table_wise"), ("t", 13, "column_wise"),
             ("a.b", 8, "table_wise"), ("a-b", 8, "table_wise"), ("../x", 8, "data_parallel")]
    for case in cases:
        assert shardflow_accepts(*case) == torchrec_builds(*case), case


# -- Parquet/Arrow: column by column, exactly as row by row -------------------------------------


def test_a_clean_typed_spec_is_validated_without_going_row_by_row(tmp_path, monkeypatch):
    import rec.spec.columnar as columnar

    spec = mixed_spec()
    path = write_spec(spec, tmp_path / "spec.parquet")
    monkeypatch.setattr(columnar, "spec_from_rows", lambda *a, **k: pytest.fail("went row by row"))
    assert read_spec(path) == spec


def _outcome(validate):
    try:
        return "ok", validate()
    except InputError as e:
        return "error", e.render()


MUTATIONS = {
    "num_embeddings": [0, -1, 2**38, 2**38 + 1, 7],
    "embedding_dim": [13, 65_540, 65_536, 2, 256],
    "name": [" padded ", "a.b", "", None, "t1", "x" * 129, "é", "ok-name"],
    "feature_names": [None, [], [" f "], ["g", "g"], ["f2"], ["a\tb"], ["café", "x.y"], [None]],
    "pooling_factor": [None, float("nan"), float("inf"), 0.0, 2.5, 1e300],
    "pooling": [None, "", " sum ", "MAX", "mean"],
    "data_type": ["fp16", "bogus", None, "INT8"],
    "sharding_types": [None, [], ["data_parallel"], ["grid_shard"], ["TABLE_WISE", "row_wise"], ["x"]],
    "compute_kernels": [None, ["dense"], ["key_value"], ["fused"], ["FUSED", "fused_uvm"]],
}
COLUMN_TYPES = {
    "num_embeddings": [pa.int64(), pa.int32(), pa.float64(), pa.string(), pa.uint64()],
    "pooling_factor": [pa.float64(), pa.float32(), pa.int64()],
}


def test_column_by_column_agrees_with_row_by_row_on_random_specs():
    """Whenever the column path accepts a spec, the row path builds the same Spec (same hash)."""
    rng = random.Random(7)
    accepted = 0
    for _ in range(300):
        n = rng.randint(1, 6)
        columns = {
            "name": [f"t{i}" for i in range(n)],
            "num_embeddings": [rng.randint(1, 10**6) for _ in range(n)],
            "embedding_dim": [rng.choice([4, 8, 64, 128]) for _ in range(n)],
            "feature_names": [[f"f{i}"] if rng.random() < 0.5 else None for i in range(n)],
            "pooling_factor": [rng.choice([None, 1.0, 3.5]) for _ in range(n)],
            "pooling": [rng.choice([None, "SUM", "MEAN"]) for _ in range(n)],
            "data_type": [rng.choice([None, "FP32", "FP16"]) for _ in range(n)],
            "sharding_types": [None] * n,
            "compute_kernels": [None] * n,
        }
        for _ in range(rng.randint(0, 2)):
            column = rng.choice(list(MUTATIONS))
            columns[column][rng.randrange(n)] = rng.choice(MUTATIONS[column])
        schema = {c: rng.choice(COLUMN_TYPES[c]) for c in COLUMN_TYPES}
        for column in rng.sample(["feature_names", "pooling", "data_type", "sharding_types", "compute_kernels"], 2):
            del columns[column]  # absent columns take their defaults
        try:
            table = pa.table({c: pa.array(v, type=schema.get(c)) for c, v in columns.items()})
        except (pa.ArrowInvalid, pa.ArrowTypeError, OverflowError):
            continue  # a cell the column type cannot hold: no such file can exist
        fast = _outcome(functools.partial(columnar_spec, table))
        if fast == ("ok", None):
            continue  # the row validator decides alone
        accepted += fast[0] == "ok"
        assert fast == _outcome(functools.partial(spec_from_rows, table.to_pylist())), table.to_pylist()
    assert accepted > 50


# -- YAML and JSON documents (rec.documents) ----------------------------------------------

TRICKY_YAML = """\
ints: [0x1F, 1_000, 1:30, -017, +5, 0b101]
floats: [.inf, -.Inf, 1.5e3, 6.8523015e+5, 190:20:30.15]
others: [~, null, yes, No, on, 2001-12-14, 2001-12-14t21:59:43.10-05:00, "quoted", '01', !!str 5, !!float 3]
base: &base {x: 1, y: [a, b]}
merged: {<<: *base, y: 3}
merged_list: {<<: [*base, {x: 9, z: 0}], w: 1}
shared: [*base, *base]
binary: !!binary aGVsbG8=
"""


@pytest.mark.parametrize("path", sorted((ROOT / "examples").rglob("*.yaml")), ids=lambda p: p.name)
def test_yaml_documents_load_as_pyyaml_safe_load_does(path):
    import yaml

    text = path.read_text()
    assert load_yaml(text) == yaml.safe_load(text)


def test_yaml_scalars_and_merge_keys_load_as_pyyaml_safe_load_does():
    import yaml

    expected = yaml.safe_load(TRICKY_YAML)
    assert expected["floats"][2] == "1.5e3"
    expected["floats"][2] = 1500.0  # a number with an exponent is a number (YAML 1.2, JSON); PyYAML: text
    # YAML 1.2 (and JSON) reads -017 as decimal, and YAML 1.1's 1_000, base-60 and binary forms as text.
    assert expected["ints"] == [31, 1000, 90, -15, 5, 5] and expected["floats"][4] == 685230.15
    expected["ints"] = [31, "1_000", "1:30", -17, 5, "0b101"]
    expected["floats"][4] = "190:20:30.15"
    # YAML 1.1's yes, No and on are YAML 1.2 text: a table named NO once read "expected text, got False"
    assert expected["others"][2:5] == [True, False, True]
    expected["others"][2:5] = ["yes", "No", "on"]
    assert load_yaml(TRICKY_YAML) == expected
    assert load_yaml("[true, True, TRUE, false, False, FALSE]") == [True] * 3 + [False] * 3
    assert load_yaml("") is None and load_yaml("# only a comment\n") is None


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a: 1\nb: 2\na: 3\n", "the key 'a' is written twice in the mapping that starts at line 1"),
        ("- {x: 1, x: 1}\n", "the key 'x' is written twice"),
        ("? [a]\n: 1\n", "a mapping key must be a plain value"),
        ("a: *nowhere\n", "has no anchor"),
        ("a: !!set {x}\n", "unsupported YAML tag"),
        ("a: {<<: 5}\n", "'<<' merges a mapping"),
    ],
)
def test_yaml_documents_refuse_what_pyyaml_would_silently_accept_or_crash_on(text, expected):
    with pytest.raises(DocumentError, match=expected):
        load_yaml(text)


def test_yaml_anchors_may_be_reused_but_not_to_blow_up_a_document():
    many = "x: &x [a, b, c]\ny: [" + ", ".join(["*x"] * 1000) + "]\n"
    assert len(load_yaml(many)["y"]) == 1000  # 3,000 values from 1,000 aliases: fine
    nested = "a0: &a0 [" + ", ".join(["z"] * 10) + "]\n"
    nested += "".join(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]\n" for i in range(1, 6))
    with pytest.raises(DocumentError, match="alias bomb"):
        load_yaml(nested)  # 10^6 values from 60 written


def test_json_documents_refuse_a_key_written_twice_and_deep_nesting():
    assert load_json('{"a": [1, NaN]}')["a"][0] == 1
    with pytest.raises(DocumentError, match="the key 'a' is written twice"):
        load_json('{"a": 1, "a": 2}')
    with pytest.raises(DocumentError, match="nested too deeply"):
        load_json("[" * 100_000 + "]" * 100_000)


def _hash_by_definition(spec: Spec) -> str:
    from rec.hashing import content_hash
    from rec.spec.columns import table_to_row
    from rec.spec.hashing import SPEC_HASH_FORMAT

    rows = sorted((table_to_row(t) for t in spec.tables), key=lambda row: str(row["name"]))
    return content_hash({"format": SPEC_HASH_FORMAT, "tables": rows})


def test_spec_hash_is_canonical_json_of_the_sorted_rows():
    from rec.spec.synthetic import issue2282_spec, power_law_spec

    odd = spec_from_rows([
        {"name": "b", "num_embeddings": 7, "embedding_dim": 4, "feature_names": ["café", "ü€x", "\"q\"", "a\\b"],
         "pooling_factor": 1e-7, "sharding_types": ["row_wise", "data_parallel"],
         "compute_kernels": ["dense", "fused"]},
        {"name": "a", "num_embeddings": 2**41, "embedding_dim": 2, "sharding_types": ["data_parallel"],
         "pooling_factor": 1.25e7, "data_type": "int4", "pooling": "mean"},
        {"name": "c", "num_embeddings": 3, "embedding_dim": 8, "pooling_factor": 0.1 + 0.2, "optimizer": "adam"},
    ])
    for spec in (odd, spec_from_rows(ROWS), mixed_spec(3), issue2282_spec(300), power_law_spec(300)):
        assert spec.spec_hash == _hash_by_definition(spec)


@pytest.mark.parametrize("name", ["items", "keys", "update", "_modules", "__dict__"])
def test_a_table_named_like_a_method_of_the_module_dict_holding_the_tables_is_refused(name):
    with pytest.raises(InputError, match=r"nn\.ModuleDict"):
        spec_from_rows([{"name": name, "num_embeddings": 10, "embedding_dim": 4}])


def test_the_reserved_names_are_those_of_the_installed_torch():
    import torch

    from rec.spec.limits import MODULE_DICT_NAMES, MODULE_DICT_ONLY

    names = {n for n in dir(torch.nn.ModuleDict()) if not n.startswith("__")}
    assert names == MODULE_DICT_NAMES
    assert {n for n in dir(torch.nn.Module()) if not n.startswith("__")} == MODULE_DICT_NAMES - MODULE_DICT_ONLY


@pytest.mark.parametrize("module", ["train.ebc", "towers.0.forward", "x.training"])
def test_a_module_path_through_a_name_every_module_has_is_refused(module):
    """Such a model cannot be built ("attribute 'train' already exists"): the plan was once written, and
    --planner torchrec and the GPU check failed later with a traceback."""
    with pytest.raises(InputError, match=r"its part '\w+' is the name of an attribute of PyTorch's nn\.Module"):
        spec_from_rows([{"name": "a", "num_embeddings": 10, "embedding_dim": 4, "module": module}])
    spec_from_rows([{"name": "a", "num_embeddings": 10, "embedding_dim": 4, "module": "towers.items.ebc"}])


def test_a_tables_own_optimizer_is_kept_through_every_format_and_leaves_other_specs_hashes_alone(tmp_path):
    rows = [{"name": "adam", "num_embeddings": 100, "embedding_dim": 64, "optimizer": "Adam"},
            {"name": "plain", "num_embeddings": 100, "embedding_dim": 64}]
    spec = spec_from_rows(rows)
    assert [t.optimizer for t in spec.tables] == ["adam", None]
    plain = spec_from_rows(rows[1:])
    assert plain.spec_hash == spec_from_rows([{**rows[1], "optimizer": None}]).spec_hash
    assert spec.spec_hash != spec_from_rows([{**rows[0], "optimizer": "sgd"}, rows[1]]).spec_hash
    for ext in ("parquet", "csv", "yaml", "json", "arrow"):
        assert read_spec(write_spec(spec, tmp_path / f"s.{ext}")) == spec
    write_spec(plain, tmp_path / "plain.parquet")
    assert "optimizer" not in pq.read_schema(tmp_path / "plain.parquet").names  # written as before
    with pytest.raises(InputError, match=r"optimizer: unknown optimizer 'lamb' \(known: none, sgd, adam"):
        spec_from_rows([{**rows[0], "optimizer": "lamb"}])


def test_min_partition_is_kept_through_every_format_and_leaves_other_specs_hashes_alone(tmp_path):
    rows = [{"name": "wide", "num_embeddings": 100, "embedding_dim": 512, "min_partition": 256},
            {"name": "plain", "num_embeddings": 100, "embedding_dim": 64}]
    spec = spec_from_rows(rows)
    assert [t.min_partition for t in spec.tables] == [256, None]
    assert spec.spec_hash != spec_from_rows([{**rows[0], "min_partition": None}, rows[1]]).spec_hash
    plain = spec_from_rows(rows[1:])
    assert plain.spec_hash == spec_from_rows([{**rows[1], "min_partition": ""}]).spec_hash
    for ext in ("parquet", "csv", "yaml", "json", "arrow"):
        assert read_spec(write_spec(spec, tmp_path / f"s.{ext}")) == spec
    write_spec(plain, tmp_path / "plain.parquet")
    assert "min_partition" not in pq.read_schema(tmp_path / "plain.parquet").names  # written as before
    with pytest.raises(InputError, match="min_partition"):
        spec_from_rows([{**rows[0], "min_partition": 0}])


def test_a_cache_floor_is_kept_through_every_format_and_given_beside_a_fixed_size_is_named(tmp_path):
    rows = [{"name": "big", "num_embeddings": 10_000, "embedding_dim": 64, "min_cache_load_factor": 0.05},
            {"name": "plain", "num_embeddings": 100, "embedding_dim": 64, "cache_load_factor": 0.3}]
    spec = spec_from_rows(rows)
    assert [(t.min_cache_load_factor, t.cache_load_factor) for t in spec.tables] == [(0.05, None), (None, 0.3)]
    fixed = spec_from_rows([{**rows[0], "min_cache_load_factor": None, "cache_load_factor": 0.05}, rows[1]])
    assert spec.spec_hash != fixed.spec_hash  # a floor is not a fixed size
    for ext in ("parquet", "csv", "yaml", "json", "arrow"):
        assert read_spec(write_spec(spec, tmp_path / f"s.{ext}")) == spec
    write_spec(fixed, tmp_path / "fixed.parquet")
    assert "min_cache_load_factor" not in pq.read_schema(tmp_path / "fixed.parquet").names  # written as before
    with pytest.raises(InputError) as e:
        spec_from_rows([{**rows[0], "cache_load_factor": 0.2}, {**rows[1], "min_cache_load_factor": 1.5}])
    text = e.value.render()
    assert "table 'big': cache_load_factor and min_cache_load_factor: give one" in text
    assert "table 'plain': min_cache_load_factor: must be in (0, 1]" in text


def test_a_default_written_out_a_shared_name_and_a_csv_list_separator(tmp_path):
    """Every sharding type and kernel listed is the default, and hashes as it; a table of a module is
    named by its key in errors (several modules may share a name); a feature name holding CSV's list
    separator is refused for CSV, where it would read back as two features, and kept elsewhere."""
    every = {"sharding_types": ["table_wise", "row_wise", "column_wise", "data_parallel", "table_row_wise",
                                "table_column_wise"], "compute_kernels": ["fused", "dense", "fused_uvm",
                                                                          "fused_uvm_caching"]}
    row = {"name": "a", "num_embeddings": 10, "embedding_dim": 8}
    assert spec_from_rows([{**row, **every}]).spec_hash == spec_from_rows([row]).spec_hash
    with pytest.raises(InputError) as e:
        spec_from_rows([{**row, "module": "m1"}, {**row, "module": "m2", "pooling_factor": 0}])
    assert "table 'a' in module 'm2': pooling_factor" in e.value.render()
    spec = spec_from_rows([{**row, "feature_names": ["clicks;7d"]}])
    with pytest.raises(InputError, match=r"feature name 'clicks;7d' holds ';', CSV's list separator"):
        write_spec(spec, tmp_path / "s.csv")
    assert not (tmp_path / "s.csv").exists()
    assert read_spec(write_spec(spec, tmp_path / "s.yaml")) == spec
