"""Allow-lists name every value they cannot use at once, and never offer a refused name as known."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from flows.cli import main
from rec.errors import InputError
from rec.spec import spec_from_rows

TABLE = {"name": "t", "num_embeddings": 1000, "embedding_dim": 16}
KNOWN_TYPES = "data_parallel, table_wise, column_wise, row_wise, table_row_wise, table_column_wise"


def problem(**cells) -> str:
    with pytest.raises(InputError) as e:
        spec_from_rows([{**TABLE, **cells}])
    (only,) = e.value.problems
    return only.reason


def test_every_unknown_sharding_type_is_named_and_refused_ones_are_not_listed_as_known():
    reason = problem(sharding_types=["bogus", "table_wise", "zzz"])
    assert reason == f"sharding_types: unknown sharding types 'bogus', 'zzz' (known: {KNOWN_TYPES})"
    assert "grid_shard" not in reason


def test_unknown_and_refused_values_are_reported_together():
    reason = problem(sharding_types="nope;grid_shard", compute_kernels=None)
    assert "unknown sharding type 'nope'" in reason and "grid_shard is not planned by shardflow" in reason
    reason = problem(compute_kernels=["turbo", "key_value", "warp"])
    assert "unknown compute kernels 'turbo', 'warp' (known: dense, fused, fused_uvm, fused_uvm_caching)" in reason
    assert "key_value needs an SSD tier" in reason


def test_spec_validate_names_every_unknown_value_of_a_parquet_spec(tmp_path, capsys):
    path = tmp_path / "s.parquet"
    pq.write_table(pa.table({"name": ["a", "b"], "num_embeddings": [10, 20], "embedding_dim": [8, 8],
                             "sharding_types": [["bogus", "zzz"], ["table_wise"]],
                             "compute_kernels": [["fused"], ["qqq", "key_value"]]}), path)
    assert main(["spec", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert "unknown sharding types 'bogus', 'zzz'" in err and "unknown compute kernel 'qqq'" in err
    assert "key_value needs an SSD tier" in err and "Traceback" not in err
