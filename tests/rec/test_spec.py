from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from rec.errors import InputError
from rec.sharding import ComputeKernel, DataType, Pooling, ShardingType
from rec.spec import Spec, read_spec, spec_from_rows, write_spec
from rec.spec.synthetic import mixed_spec

EXTENSIONS = [".parquet", ".pq", ".arrow", ".feather", ".ipc", ".csv", ".yaml", ".yml", ".json"]

ROWS = [
    {"name": "users", "num_embeddings": 1000, "embedding_dim": 16},
    {
        "name": "items",
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
    assert spec_from_rows(ROWS).names == ["users", "items", "country"]


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
    changed = [dict(ROWS[0], embedding_dim=17), *ROWS[1:]]
    assert spec_from_rows(changed).spec_hash != spec_from_rows(ROWS).spec_hash


def test_hash_ignores_how_a_value_was_spelled():
    spelled = [
        dict(ROWS[1], sharding_types="TABLE_WISE;row_wise", pooling="mean", data_type="fp16", compute_kernels=["FUSED"]),
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
        ({"pooling": "MAX"}, "pooling: unknown pooling 'MAX' (known: SUM, MEAN)"),
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
        ("bad.yaml", "tables: [\n", "not valid yaml"),
        ("bad.json", "{", "not valid json"),
        ("bad.parquet", "not parquet", "not valid parquet"),
        ("bad.feather", "not arrow", "not valid arrow"),
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
        spec.tables[0].num_embeddings = 1  # type: ignore[misc]
