"""Deterministic synthetic specs for tests, examples and benchmarks (same seed, same spec)."""

from __future__ import annotations

import numpy as np

from rec.spec.types import Spec
from rec.spec.validate import spec_from_rows

CRITEO_1TB_ROWS = (
    40000000, 39060, 17295, 7424, 20265, 3, 7122, 1543, 63, 40000000, 3067956, 405282, 10,
    2209, 11938, 155, 4, 976, 14, 40000000, 40000000, 40000000, 590152, 12973, 108, 36,
)  # fmt: skip
POWER_LAW_DIMS = (16, 32, 64, 128, 256)


def issue2282_spec(n_tables: int, seed: int = 0) -> Spec:
    """TorchRec issue 2282's shape: many small tables, dim 4, 8, 12 or 16, 2..1000 rows, one feature each.

    Dims are multiples of 4 because TorchRec's fused kernels refuse any other (``rec.spec.limits``).
    """
    rng = np.random.default_rng(seed)
    dims = rng.integers(1, 4, size=n_tables, endpoint=True) * 4
    rows = rng.integers(2, 1000, size=n_tables, endpoint=True)
    return _numbered_spec(rows, dims, None, f"issue2282_spec({n_tables}, seed={seed})")


def power_law_spec(n_tables: int, seed: int = 0, alpha: float = 0.5) -> Spec:
    """Row counts from a power law on [1e3, 2e8] (density ~ x^-(1+alpha)), dims 16..256, pooling 1..50."""
    rng = np.random.default_rng(seed)
    low, high = 1e3, 2e8
    u = rng.random(n_tables)
    # Inverse CDF of the bounded Pareto: most tables are small, a few reach 1e7..2e8 rows.
    rows = np.clip(np.rint((low**-alpha - u * (low**-alpha - high**-alpha)) ** (-1 / alpha)), low, high)
    dims = rng.choice(POWER_LAW_DIMS, size=n_tables)
    pooling = np.round(rng.uniform(1.0, 50.0, size=n_tables), 1)
    return _numbered_spec(rows, dims, pooling, f"power_law_spec({n_tables}, seed={seed})")


RANDOM_DIMS = (8, 16, 32, 64, 128, 256)


def random_table_rows(seed: int, tables: int, column_share: float, memory_bytes: float,
                      max_table_bytes: float | None = None) -> list[dict[str, object]]:
    """Random tables (spec rows) of the shapes recommenders train: dims 8-256, rows 1e3-1e7 (log-uniform),
    pooling factors 1-50 (log-uniform), a share allow-listed column-wise (dim 256); their weights under
    ``memory_bytes`` together, each under ``max_table_bytes`` (default: half of it). The calibration
    bench's specs and the GPU calibration's mixed probes."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, object]] = []
    total = 0.0
    for i in range(tables):
        dim = int(rng.choice(RANDOM_DIMS))
        count = int(10 ** rng.uniform(3, 7))
        count = max(1000, min(count, int((memory_bytes - total) / (dim * 4) / max(1, tables - i) * 4),
                              int((max_table_bytes or memory_bytes / 2) / (dim * 4))))
        total += count * dim * 4
        row: dict[str, object] = {"name": f"t{i}", "num_embeddings": count, "embedding_dim": dim,
                                  "pooling_factor": float(np.round(10 ** rng.uniform(0, np.log10(50)), 1))}
        if rng.random() < column_share:
            row["embedding_dim"] = 256
            row["sharding_types"] = ["column_wise", "table_column_wise"]
        rows.append(row)
    return rows


def _numbered_spec(rows: np.ndarray, dims: np.ndarray, pooling_factors: np.ndarray | None, source: str) -> Spec:
    """Tables ``table_<i>`` with one feature ``feature_<i>`` each (``i`` zero-padded to one width)."""
    width = len(str(max(len(rows) - 1, 0)))
    tables: list[dict[str, object]] = [
        {"name": f"table_{i:0{width}d}", "num_embeddings": int(rows[i]), "embedding_dim": int(dims[i]),
         "feature_names": [f"feature_{i:0{width}d}"]}
        for i in range(len(rows))
    ]
    if pooling_factors is not None:
        for table, pooling_factor in zip(tables, pooling_factors.tolist(), strict=True):
            table["pooling_factor"] = float(pooling_factor)
    return spec_from_rows(tables, source=source)


def criteo_1tb_spec() -> Spec:
    """The 26 categorical tables of MLPerf DLRM-DCNv2 on Criteo 1TB (dim 128, one id per feature)."""
    return spec_from_rows(
        [
            {"name": f"t_cat_{i}", "num_embeddings": rows, "embedding_dim": 128, "feature_names": [f"cat_{i}"]}
            for i, rows in enumerate(CRITEO_1TB_ROWS)
        ],
        source="criteo_1tb_spec()",
    )


def mixed_spec(seed: int = 0) -> Spec:
    """150 heterogeneous tables: 3 huge (>100M rows), 47 medium, 100 tiny; mixed dims, pooling, FP16."""
    rng = np.random.default_rng(seed)
    rows: list[dict[str, object]] = []
    for i in range(3):
        rows.append(
            {
                "name": f"huge_{i}",
                "num_embeddings": int(rng.integers(120_000_000, 400_000_000)),
                "embedding_dim": int(rng.choice((64, 128))),
                "pooling_factor": float(np.round(rng.uniform(1.0, 5.0), 1)),
                "data_type": "FP16" if i == 0 else "FP32",
            }
        )
    for i in range(47):
        n_features = 3 if i % 10 == 0 else 1  # a few tables shared by several features
        name = f"medium_{i:02d}"
        rows.append(
            {
                "name": name,
                "num_embeddings": int(10 ** rng.uniform(5, 7)),
                "embedding_dim": int(rng.choice((32, 64, 128, 256, 512))),
                "feature_names": [name] if n_features == 1 else [f"{name}_f{j}" for j in range(n_features)],
                "pooling": "MEAN" if i % 9 == 4 else "SUM",
                "pooling_factor": float(np.round(rng.uniform(1.0, 30.0) if i % 7 else rng.uniform(50, 100), 1)),
                "data_type": "FP16" if i == 1 else "FP32",
            }
        )
    for i in range(100):
        rows.append(
            {
                "name": f"tiny_{i:03d}",
                "num_embeddings": int(10 ** rng.uniform(1, 4)),
                "embedding_dim": int(rng.choice((8, 16, 32))),
                "pooling_factor": float(np.round(rng.uniform(1.0, 3.0), 1)),
            }
        )
    return spec_from_rows(rows, source=f"mixed_spec(seed={seed})")
