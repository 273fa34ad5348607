"""Out-of-family workloads for the calibration section: shapes from generators that no cost-model
term and no calibration probe was chosen looking at, so that the calibrated profile's error on them
says how it does on workloads it was not fitted to (the calibration bench's specs,
``workloads.CALIBRATION_SPECS``, flatter it). Only the calibration section imports this module, nothing
under ``rec/`` (tests/bench/test_families.py keeps it so), and every seed comes from ``OOF_SEEDS``,
disjoint from the calibration bench's and the calibration probes' seeds. The families:

* ``criteo``: Criteo Kaggle's or Terabyte's 26 categorical features, hashed to a cap, one id each, dim 64 or 128;
* ``two_tower``: a user tower whose history sequences sit in an EmbeddingCollection (pooling none,
  20-200 ids a sequence) beside pooled user features, and an item tower of pooled item features;
* ``power_law``: rows bounded-Pareto over 1e3-1e8, dims multiples of 4 from 16 to 256, pooling
  factors lognormal;
* ``memory_tight``: tables 2-10 times the ranks' HBM cap together, so that they go to
  fused_uvm_caching or fused_uvm, each with a ``hit_rate_curve`` of its own skew. Only on cuda:
  cpu ranks have no uvm kernels.

Sized as the calibration bench's specs are (``workloads.calibration_workloads``): on cuda a quarter of
the ranks' HBM and a batch of thousands per rank (the calibration section then doubles it until the
iteration is GPU-sized); on cpu 50 MB of tables, one workload per family, for 2 gloo ranks in seconds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

import numpy as np

from bench.gpu_check.workloads import GIB, Ranks, Workload

OOF_SEEDS = range(1000, 2000)  # reserved: no other generator of the check draws from these


class Family(StrEnum):
    CRITEO = "criteo"
    TWO_TOWER = "two_tower"
    POWER_LAW = "power_law"
    MEMORY_TIGHT = "memory_tight"


FIRST_SEED = {Family.CRITEO: 1000, Family.TWO_TOWER: 1100, Family.POWER_LAW: 1200, Family.MEMORY_TIGHT: 1300}
PER_FAMILY = {True: 2, False: 1}  # workloads of each family on cuda, on cpu
CUDA_ONLY = {Family.MEMORY_TIGHT: "needs a cuda topology: cpu ranks have no uvm kernels (fused_uvm, "
                                  "fused_uvm_caching)"}
CPU_TABLE_BYTES = 5e7
# Batch per rank (cpu, cuda): on cuda 16 times the cpu one, as the calibration bench's specs, but for
# the two towers, whose sequences make a cpu iteration long.
BATCH = {Family.CRITEO: (512, 8192), Family.TWO_TOWER: (64, 2048), Family.POWER_LAW: (256, 4096),
         Family.MEMORY_TIGHT: (128, 2048)}

# Cardinalities of the 26 categorical features: Criteo Kaggle (Display Advertising Challenge) and
# Criteo Terabyte (24 days), before any hashing.
CRITEO_KAGGLE = (1460, 583, 10131227, 2202608, 305, 24, 12517, 633, 3, 93145, 5683, 8351593, 3194, 27,
                 14992, 5461306, 10, 5652, 2173, 4, 7046547, 18, 15, 286181, 105, 142572)
CRITEO_TERABYTE = (45833188, 36746, 17245, 7413, 20243, 3, 7114, 1441, 62, 29275261, 1572176, 345138, 10,
                   2209, 11267, 128, 4, 974, 14, 48937457, 11316796, 40094537, 452104, 12606, 104, 35)
CACHE_FRACTIONS = (0.01, 0.02, 0.05, 0.1, 0.2, 0.5)


@dataclass(frozen=True)
class OutOfFamily:
    """The out-of-family workloads for some ranks, and the families left out there with the reason."""

    workloads: tuple[Workload, ...]
    skipped: dict[str, str]


def out_of_family(ranks: Ranks) -> OutOfFamily:
    """Every family these ranks can run, ``PER_FAMILY`` workloads each, ordered round by round
    (one of each family, then the next of each), so that a budget cut takes whole rounds."""
    families = [f for f in Family if ranks.cuda or f not in CUDA_ONLY]
    drawn = [generate(f, ranks, FIRST_SEED[f] + i) for i in range(PER_FAMILY[ranks.cuda]) for f in families]
    return OutOfFamily(tuple(drawn), {f.value: why for f, why in CUDA_ONLY.items() if f not in families})


def generate(family: Family, ranks: Ranks, seed: int) -> Workload:
    """The workload ``oof_<family>_s<seed>``; ValueError for a seed outside ``OOF_SEEDS``, or a
    cuda-only family on cpu ranks."""
    if seed not in OOF_SEEDS:
        raise ValueError(f"seed {seed} is not in the out-of-family range {OOF_SEEDS.start}-{OOF_SEEDS.stop - 1}")
    rng = np.random.default_rng(seed)
    name = f"oof_{family.value}_s{seed}"
    budget = 0.25 * ranks.hbm_bytes * ranks.world_size if ranks.cuda else CPU_TABLE_BYTES
    on_cpu, on_cuda = BATCH[family]
    batch = on_cuda if ranks.cuda else on_cpu
    if family is Family.CRITEO:
        return Workload(name, criteo_rows(rng, budget), batch, family=family.value)
    if family is Family.TWO_TOWER:
        return Workload(name, two_tower_rows(rng, budget), batch, family=family.value)
    if family is Family.POWER_LAW:
        return Workload(name, power_law_rows(rng, budget, 48 if ranks.cuda else 10), batch, family=family.value)
    if not ranks.cuda:
        raise ValueError(f"{name}: {CUDA_ONLY[family]}")
    rows, hbm = memory_tight_rows(rng, ranks)
    return Workload(name, rows, batch, hbm_bytes=hbm, family=family.value)


def criteo_rows(rng: np.random.Generator, budget: float) -> list[dict[str, Any]]:
    """Kaggle's or Terabyte's cardinalities (each varied by up to ~30%), hashed to a cap of 1e5-3e7
    rows, lower where the tables would not fit ``budget`` bytes."""
    base = np.array(CRITEO_KAGGLE if rng.random() < 0.5 else CRITEO_TERABYTE, dtype=np.float64)
    cardinalities = np.maximum(2, np.rint(base * np.exp(rng.normal(0.0, 0.25, base.size)))).astype(np.int64)
    dim = int(rng.choice((64, 128)))
    rows = hashed(cardinalities, int(10 ** rng.uniform(5, 7.5)), [dim] * base.size, budget)
    return [{"name": f"cat_{i}", "num_embeddings": int(r), "embedding_dim": dim, "pooling_factor": 1.0}
            for i, r in enumerate(rows)]


def two_tower_rows(rng: np.random.Generator, budget: float) -> list[dict[str, Any]]:
    """A user tower (pooled user features; an EmbeddingCollection of history sequences, one length
    each of 20-200 ids, one dim) and an item tower (pooled item features)."""
    items = int(10 ** rng.uniform(5, 7.5))
    seq_dim = int(rng.choice((32, 64, 128)))
    history = float(np.round(rng.uniform(20, 200)))
    searches = float(np.round(rng.uniform(20, 200)))
    sequences = [("item_history", items, history), ("category_history", int(10 ** rng.uniform(2.5, 4)), history),
                 ("action_history", 16, history), ("search_history", int(10 ** rng.uniform(5, 7)), searches)]
    user = [("user_id", int(10 ** rng.uniform(6, 8)), 1.0), ("user_geo", int(10 ** rng.uniform(3, 5)), 1.0),
            ("user_age", 128, 1.0), ("user_interests", int(10 ** rng.uniform(3, 4.5)), _lognormal(rng, 8.0, 0.6))]
    item = [("item_id", items, 1.0), ("item_brand", int(10 ** rng.uniform(4, 5.5)), 1.0),
            ("item_tags", int(10 ** rng.uniform(3, 4.5)), _lognormal(rng, 5.0, 0.6))]
    pooled_dims = [int(rng.choice((32, 64, 128))) for _ in (*user, *item)]
    groups = [("user_tower.history", sequences, [seq_dim] * len(sequences), "NONE"),
              ("user_tower.features", user, pooled_dims[:len(user)], None),
              ("item_tower.features", item, pooled_dims[len(user):], None)]
    dims = [d for _, _, ds, _ in groups for d in ds]
    rows = iter(hashed(np.array([r for _, ts, _, _ in groups for _, r, _ in ts]), 10**9, dims, budget))
    out: list[dict[str, Any]] = []
    for module, tables, table_dims, pooling in groups:
        for (name, _, pooling_factor), dim in zip(tables, table_dims, strict=True):
            row = {"name": name, "num_embeddings": int(next(rows)), "embedding_dim": dim,
                   "pooling_factor": pooling_factor, "module": module}
            out.append({**row, "pooling": pooling} if pooling else row)
    return out


def power_law_rows(rng: np.random.Generator, budget: float, tables: int) -> list[dict[str, Any]]:
    """``tables`` tables: rows from a bounded Pareto on [1e3, 1e8] (a heavy tail, alpha 0.25-0.4,
    stratified so the draw reaches its tail), dims multiples of 4 from 16 to 256, pooling factors
    lognormal (median 3, up to 200); the largest hashed down where they would not fit ``budget``."""
    alpha = rng.uniform(0.25, 0.4)
    low, high = 1e3, 1e8
    u = rng.permutation((np.arange(tables) + rng.random(tables)) / tables)
    drawn = np.rint((low**-alpha - u * (low**-alpha - high**-alpha)) ** (-1 / alpha)).astype(np.int64)
    dims = [int(d) for d in rng.integers(4, 65, size=tables) * 4]
    rows = hashed(drawn, int(high), dims, budget)
    return [{"name": f"p{i}", "num_embeddings": int(r), "embedding_dim": d, "pooling_factor": _lognormal(rng, 3.0, 1.0)}
            for i, (r, d) in enumerate(zip(rows, dims, strict=True))]


def memory_tight_rows(rng: np.random.Generator, ranks: Ranks) -> tuple[list[dict[str, Any]], int]:
    """(spec rows, HBM cap per rank) for cuda ranks: 12-24 tables of 8% of the ranks' HBM together
    (as the TorchRec comparison's memory-tight shape: the measuring job builds their uvm copies in
    host memory once per repeat), the cap 2-10 times smaller than they are; each table with a curve
    of its own skew (the ``f`` hottest rows serve ``f ** a`` of the lookups, ``a`` 0.1-0.6)."""
    total = 0.08 * ranks.hbm_bytes * ranks.world_size
    tables = int(rng.integers(12, 25))
    dims = rng.choice((64, 128), size=tables)
    raw = 10 ** rng.uniform(5.5, 7.5, size=tables)
    rows = np.maximum(1000, np.rint(raw * total / float(np.sum(raw * dims * 4)))).astype(np.int64)
    out: list[dict[str, Any]] = []
    for i, (r, d) in enumerate(zip(rows.tolist(), dims.tolist(), strict=True)):
        skew = rng.uniform(0.1, 0.6)
        curve = [[f, round(f**skew, 4)] for f in CACHE_FRACTIONS]
        out.append({"name": f"m{i}", "num_embeddings": r, "embedding_dim": d,
                    "pooling_factor": float(np.round(10 ** rng.uniform(0, 1.3), 1)), "hit_rate_curve": curve})
    table_bytes = sum(r["num_embeddings"] * r["embedding_dim"] * 4 for r in out)
    times = rng.uniform(2, 10)
    return out, max(GIB // 4, int(table_bytes / (times * ranks.world_size)))


def hashed(cardinalities: np.ndarray, cap: int, dims: Sequence[int], budget: float) -> np.ndarray:
    """Rows per table: ``cardinalities`` hashed to at most ``cap`` rows, the cap lowered (as a smaller
    hash size would) until the tables' weights fit ``budget`` bytes."""
    cardinalities = np.asarray(cardinalities, dtype=np.int64)
    width = np.asarray(dims, dtype=np.float64) * 4

    def weights(c: int) -> float:
        return float(np.sum(np.minimum(cardinalities, c) * width))

    lo, hi = 1, max(1, min(cap, int(cardinalities.max())))
    if weights(hi) <= budget:
        return np.minimum(cardinalities, hi)
    while lo < hi:  # the largest cap that fits
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if weights(mid) <= budget else (lo, mid - 1)
    return np.maximum(1, np.minimum(cardinalities, lo))


def _lognormal(rng: np.random.Generator, median: float, sigma: float) -> float:
    return float(np.clip(np.round(median * np.exp(rng.normal(0.0, sigma)), 1), 1.0, 200.0))
