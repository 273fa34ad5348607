"""Training data for the ``data`` section: a workload's features written as Parquet, in the layout
the training job reads (docs/training.md), with ids drawn as the synthetic batches draw them."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench.gpu_check.workloads import Workload
from rec.data.synthetic import table_ids
from rec.spec import spec_from_rows

DENSE = 13  # the training job's --dense-in-features default
ROW_GROUP = 1 << 16


def write_parquet(workload: Workload, rows: int, path: Path, seed: int = 0) -> int:
    """``rows`` rows for ``workload``'s tables (one list<int64> column per feature, Poisson(pooling
    factor) ids per row from its table's hit-rate curve or the skew model, the hot rows scattered over
    the table as ``rec.data.synthetic`` draws them), written row group by row group; the bytes written."""
    rng = np.random.default_rng(seed)
    features = [(f, t) for t in spec_from_rows(workload.rows).tables for f in t.feature_names]
    schema = pa.schema([("label", pa.float32()), ("dense", pa.list_(pa.float32(), DENSE)),
                        *((f, pa.list_(pa.int64())) for f, _ in features)])
    with pq.ParquetWriter(str(path), schema, compression="lz4") as writer:
        for start in range(0, rows, ROW_GROUP):
            n = min(ROW_GROUP, rows - start)
            columns = [pa.array((rng.random(n) < 0.25).astype(np.float32)),
                       pa.FixedSizeListArray.from_arrays(pa.array(rng.random(n * DENSE, np.float32)), DENSE)]
            for _, t in features:
                lengths = rng.poisson(t.pooling_factor, n) if t.pooling_factor != 1.0 else np.ones(n, np.int64)
                offsets = np.zeros(n + 1, np.int32)
                np.cumsum(lengths, out=offsets[1:])
                ids = table_ids(rng.random(int(offsets[-1])), t.num_embeddings, t.hit_rate_curve).astype(np.int64)
                columns.append(pa.ListArray.from_arrays(pa.array(offsets), pa.array(ids)))
            writer.write_table(pa.Table.from_arrays(columns, schema=schema))
    return path.stat().st_size
