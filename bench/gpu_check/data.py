"""Training data for the ``data`` section: a workload's features written as Parquet, in the layout
the training job reads (docs/training.md), with ids drawn as the synthetic batches draw them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.gpu_check.workloads import Workload
from rec.hit_rates import ID_SKEW

DENSE = 13  # the training job's --dense-in-features default
ROW_GROUP = 1 << 16


def write_parquet(workload: Workload, rows: int, path: Path, seed: int = 0) -> int:
    """``rows`` rows for ``workload``'s tables (one list<int64> column per feature, Poisson(pooling
    factor) ids per row, skewed toward hot rows), written row group by row group; the bytes written."""
    rng = np.random.default_rng(seed)
    features = [(f, int(t["num_embeddings"]), float(t.get("pooling_factor", 1.0)))
                for t in workload.rows for f in t.get("feature_names", [t["name"]])]
    schema = pa.schema([("label", pa.float32()), ("dense", pa.list_(pa.float32(), DENSE)),
                        *((f, pa.list_(pa.int64())) for f, _, _ in features)])
    with pq.ParquetWriter(str(path), schema, compression="lz4") as writer:
        for start in range(0, rows, ROW_GROUP):
            n = min(ROW_GROUP, rows - start)
            columns = [pa.array((rng.random(n) < 0.25).astype(np.float32)),
                       pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * DENSE, np.float32)), DENSE)]
            for _, table_rows, pooling in features:
                lengths = rng.poisson(pooling, n) if pooling != 1.0 else np.ones(n, np.int64)
                offsets = np.zeros(n + 1, np.int32)
                np.cumsum(lengths, out=offsets[1:])
                ids = (table_rows * rng.random(int(offsets[-1])) ** ID_SKEW).astype(np.int64)
                columns.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)))
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))
    return path.stat().st_size
