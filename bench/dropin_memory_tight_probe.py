"""Memory-tight workloads of a generator the planner was never tuned on: the drop-in ShardflowPlanner
against TorchRec's best proposer, both rated in TorchRec's own units by a rater of this file's
(no ``rec`` code rates: each plan's shards re-enumerated with TorchRec's estimators at the plan's
own load factors and the user's cache statistics, max over ranks of the perf sum; it reproduces
TorchRec's own rating of TorchRec's plans exactly). Written by a probe of the thirty-sixth session
(bench/RESULTS.md §12); seeds 50000 and up, apart from every other bench's.

Families by ``seed % 5``: Criteo-like power-law rows, a few giants beside many tiny tables, sequence
(EmbeddingCollection) tables beside pooled ones, a weighted EBC beside a plain one and an EC, and
many mid-sized tables; dims 8-512, fp16/fp32, pooling 1-100, 2-64 ranks of 1-80 GiB HBM, the tables
2-10x the ranks' HBM, batch 128-16384. Per-table ``CacheStatistics`` (a Zipf curve, TorchRec's
``EmbeddingOffloadStats``, a noisy curve), some load factors, caching-only allow-lists.
``--variant plain``: every table with statistics, no load factors or allow-lists; ``floors``: as
plain, every table with a load factor of 0.005-0.1 (the floor TorchRec's scale-up proposer starts
from). TorchRec's side: its default proposers, with ``EmbeddingOffloadScaleupProposer``, the
scale-up proposer alone, and DP; the best plan that fits is TorchRec's best.

    .venv/bin/python bench/dropin_memory_tight_probe.py --first-seed 50000 --count 60 --out OUT.jsonl
    .venv/bin/python bench/dropin_memory_tight_probe.py --variant floors --one 50213   # one, verbose
    .venv/bin/python bench/dropin_memory_tight_probe.py --bad-cache   # bad load factors are refused
"""

from __future__ import annotations

import argparse
import copy
import functools
import itertools
import json
import logging
import math
import sys
import time
import traceback
import warnings
import zlib
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.memory_tight_bench import _quiet as quiet  # TorchRec's warnings and logs kept out, as there

GiB = 2**30
DIMS = (8, 12, 16, 24, 32, 40, 48, 64, 96, 128, 160, 200, 256, 384, 512)
WORLDS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)


# ------------------------------------------------------------------ statistics (TorchRec CacheStatistics)

def _zipf_mass(n: float, a: float) -> float:
    """sum_{i=1..n} i^-a, by Euler-Maclaurin (first terms)."""
    if n <= 0:
        return 0.0
    if n < 50:
        k = np.arange(1, int(n) + 1, dtype=float)
        base = float(np.sum(k ** -a))
        frac = n - int(n)
        return base + frac * (int(n) + 1) ** -a
    if abs(a - 1) < 1e-9:
        integ = math.log(n)
    else:
        integ = (n ** (1 - a) - 1) / (1 - a)
    return integ + 0.5 * (1 + n ** -a) + a / 12 * (1 - n ** (-a - 1))


def zipf_miss(clf: float, rows: int, a: float) -> float:
    clf = min(max(clf, 0.0), 1.0)
    return max(0.0, min(1.0, 1.0 - _zipf_mass(clf * rows, a) / _zipf_mass(rows, a)))


def zipf_distinct(rows: int, a: float, draws: float) -> float:
    """E[distinct ids] of ``draws`` Zipf(a) draws over ``rows``: sum_i 1 - exp(-draws p_i), on a log grid."""
    total = _zipf_mass(rows, a)
    edges = np.unique(np.concatenate([np.arange(1, min(rows, 64) + 1), np.geomspace(1, rows, 400).round()]))
    edges = np.append(edges, rows + 1)
    out = 0.0
    for lo, hi in itertools.pairwise(edges):
        if hi <= lo:
            continue
        mid = math.sqrt(lo * (hi - 1)) if hi - 1 > lo else lo
        p = mid ** -a / total
        out += (hi - lo) * (1 - math.exp(-draws * p))
    return float(min(out, rows, draws))



@functools.lru_cache(None)
def make_stats_classes():
    from torchrec.distributed.types import CacheStatistics  # (not planner.types in 1.8)

    class ZipfCacheStats(CacheStatistics):
        def __init__(self, rows: int, a: float, lookups: float) -> None:
            self.rows, self.a, self._lookups = rows, a, lookups
            self._cache = float(np.mean([zipf_miss(f, rows, a) for f in np.linspace(0, 1, 101)]))

        @property
        def expected_lookups(self) -> float:
            return self._lookups

        def expected_miss_rate(self, clf: float) -> float:
            return zipf_miss(clf, self.rows, self.a)

        @property
        def cacheability(self) -> float:
            return self._cache

    class NoisyCurveStats(CacheStatistics):
        """A measured-looking curve: miss rates at 21 points with noise (not monotone), linear between."""

        def __init__(self, xs: np.ndarray, ys: np.ndarray, lookups: float) -> None:
            self.xs, self.ys, self._lookups = xs, ys, lookups

        @property
        def expected_lookups(self) -> float:
            return self._lookups

        def expected_miss_rate(self, clf: float) -> float:
            return float(np.interp(clf, self.xs, self.ys))

        @property
        def cacheability(self) -> float:
            return float(np.mean(np.interp(np.linspace(0, 1, 101), self.xs, self.ys)))

    return ZipfCacheStats, NoisyCurveStats


# ------------------------------------------------------------------ workloads

@dataclass
class T:
    name: str
    rows: int
    dim: int
    fp16: bool
    pooling: float
    alpha: float
    module: str = "ebc"  # ebc | wbc (weighted) | ec (sequence)
    features: int = 1
    stats_kind: str = "zipf"  # zipf | offload (EmbeddingOffloadStats) | noisy | none
    load_factor: float | None = None
    kernels: tuple[str, ...] | None = None
    shardings: tuple[str, ...] | None = None
    scalable: bool = True  # rows rescaled to hit the memory target


@dataclass
class W:
    seed: int
    family: str
    tables: list[T]
    world: int
    local: int
    hbm_gib: float
    batch: int
    times_hbm: float
    optim: str
    ddr: int = 0

    @property
    def name(self) -> str:
        return f"{self.family}-{self.seed}"


def _dim(rng, lo=8, hi=512):
    choices = [d for d in DIMS if lo <= d <= hi]
    return int(rng.choice(choices))


def one_dim_per_ec(tables) -> None:
    """The tables of each EmbeddingCollection module (``ec...``) at their widest dim: TorchRec's EC
    takes one dim."""
    for module in {t.module for t in tables if t.module.startswith("ec")}:
        members = [t for t in tables if t.module == module]
        dim = max(t.dim for t in members)
        for t in members:
            t.dim = dim


def fam_criteo(rng) -> list[T]:
    """26 tables, power-law row counts (rank^-k), mixed dims, pooling 1 mostly."""
    k = rng.uniform(1.5, 3.0)
    top = 10 ** rng.uniform(7, 9)
    out = []
    for i in range(26):
        rows = max(3, int(top * (i + 1) ** -k * rng.uniform(0.6, 1.6)))
        out.append(T(f"cat_{i}", rows, _dim(rng, 8, 256), bool(rng.random() < 0.4),
                     float(1 if rng.random() < 0.7 else rng.integers(2, 8)), float(rng.uniform(0.6, 1.4)),
                     scalable=rows > 100_000))
    return out


def fam_giants_tiny(rng) -> list[T]:
    g = int(rng.integers(1, 5))
    out = [T(f"giant_{i}", int(10 ** rng.uniform(8, 9.3)), _dim(rng, 32, 512), bool(rng.random() < 0.5),
             float(rng.uniform(1, 40)), float(rng.uniform(0.4, 1.3))) for i in range(g)]
    out += [T(f"tiny_{i}", int(10 ** rng.uniform(1, 4.3)), _dim(rng, 8, 64), bool(rng.random() < 0.3),
              float(rng.uniform(1, 6)), float(rng.uniform(0.7, 1.5)), scalable=False)
            for i in range(int(rng.integers(20, 120)))]
    return out


def fam_seq(rng) -> list[T]:
    """sequence (EmbeddingCollection) tables of one dim beside pooled ones of mixed dims."""
    sd = _dim(rng, 16, 256)
    out = [T(f"seq_{i}", int(10 ** rng.uniform(6.5, 8.5)), sd, bool(rng.random() < 0.5),
             float(rng.uniform(5, 100)), float(rng.uniform(0.6, 1.3)), module="ec",
             features=int(rng.integers(1, 4))) for i in range(int(rng.integers(2, 7)))]
    out += [T(f"pool_{i}", int(10 ** rng.uniform(3, 8)), _dim(rng, 8, 512), bool(rng.random() < 0.5),
              float(rng.uniform(1, 100)), float(rng.uniform(0.5, 1.5)),
              scalable=True) for i in range(int(rng.integers(8, 40)))]
    for t in out:
        t.scalable = t.rows > 200_000
    return out


def fam_weighted(rng) -> list[T]:
    """pooled + weighted id-score-list tables + a sequence table or two; pooling 1..100."""
    out = []
    for i in range(int(rng.integers(10, 50))):
        mod = "wbc" if rng.random() < 0.45 else "ebc"
        rows = int(10 ** rng.uniform(3, 8.5))
        out.append(T(f"{mod}_{i}", rows, _dim(rng, 8, 512), bool(rng.random() < 0.5),
                     float(np.clip(rng.lognormal(1.5, 1.3), 1, 100)), float(rng.uniform(0.3, 1.6)), module=mod,
                     features=int(rng.integers(1, 3)), scalable=rows > 200_000))
    ed = _dim(rng, 32, 128)
    out += [T(f"hist_{i}", int(10 ** rng.uniform(6, 8)), ed, True, float(rng.uniform(10, 100)),
              float(rng.uniform(0.7, 1.2)), module="ec") for i in range(int(rng.integers(1, 3)))]
    return out


def fam_many_mid(rng) -> list[T]:
    """60-200 mid-size tables, lognormal rows, lots of dims."""
    out = []
    for i in range(int(rng.integers(60, 200))):
        rows = int(np.clip(rng.lognormal(13, 2), 100, 5e8))
        out.append(T(f"f{i}", rows, _dim(rng), bool(rng.random() < 0.5), float(np.clip(rng.pareto(1.2) + 1, 1, 100)),
                     float(rng.uniform(0.5, 1.4)), module="ec" if rng.random() < 0.1 else "ebc",
                     scalable=rows > 100_000))
    one_dim_per_ec(out)
    return out


FAMILIES = {"criteo": fam_criteo, "giants_tiny": fam_giants_tiny, "seq": fam_seq, "weighted": fam_weighted,
            "many_mid": fam_many_mid}


def tbytes(t: T) -> int:
    return t.rows * t.dim * (2 if t.fp16 else 4)


VARIANT = "mixed"  # mixed | plain | floors  (--variant)


def workload(seed: int) -> W:
    assert seed >= 50000
    rng = np.random.default_rng(seed)
    family = list(FAMILIES)[seed % len(FAMILIES)]
    tables = FAMILIES[family](rng)
    one_dim_per_ec(tables)
    world = int(rng.choice(WORLDS))
    local = next(n for n in (8, 6, 4, 3, 2, 1) if world % n == 0 and n <= world)
    hbm_gib = float(np.round(np.exp(rng.uniform(math.log(1), math.log(80))), 2))
    times = float(rng.uniform(2.0, 10.0))
    target = times * world * hbm_gib * GiB
    fixed = sum(tbytes(t) for t in tables if not t.scalable)
    scal = sum(tbytes(t) for t in tables if t.scalable)
    if scal == 0:
        tables[0].scalable = True
        fixed -= tbytes(tables[0])
        scal = tbytes(tables[0])
    if fixed > 0.5 * target:  # shrink fixed tiny ones
        f = 0.5 * target / fixed
        for t in tables:
            if not t.scalable:
                t.rows = max(2, int(t.rows * f))
        fixed = sum(tbytes(t) for t in tables if not t.scalable)
    f = (target - fixed) / scal
    for t in tables:
        if t.scalable:
            t.rows = max(2, int(t.rows * f))
    times = sum(tbytes(t) for t in tables) / (world * hbm_gib * GiB)
    # batch: 128..16384, halved while the input reservation (20 x 8 B x ids) would take over 25% of HBM
    batch = int(2 ** rng.integers(7, 15))
    ids = sum(t.pooling * t.features for t in tables)
    while batch > 128 and 20 * 8 * ids * batch > 0.25 * hbm_gib * GiB:
        batch //= 2
    # user settings
    for t in tables:
        u = rng.random()
        t.stats_kind = "zipf" if u < 0.4 else "offload" if u < 0.65 else "noisy" if u < 0.78 else "none"
        v = rng.random()
        if v < 0.35:
            t.load_factor = float(rng.choice((0.02, 0.05, 0.1, 0.15, 0.25, 0.3, 0.5, 0.7)))
        if rng.random() < 0.15 and t.rows > 10_000:
            t.kernels = ("fused_uvm_caching",)
        elif rng.random() < 0.05:
            t.kernels = ("fused", "fused_uvm_caching")
        if rng.random() < 0.1:
            opts = [("row_wise",), ("table_wise", "row_wise"), ("column_wise", "table_wise", "row_wise"),
                    ("table_row_wise", "row_wise")]
            t.shardings = opts[int(rng.integers(0, len(opts)))]
            if t.module == "ec" and t.shardings == ("table_row_wise", "row_wise"):
                t.shardings = ("row_wise",)
    if VARIANT != "mixed":  # every table with Zipf-like statistics, no allow-lists
        vr = np.random.default_rng(seed + 7_000_000)
        for t in tables:
            t.stats_kind = "zipf" if vr.random() < 0.5 else "offload"
            t.kernels = t.shardings = None
            t.load_factor = None if VARIANT == "plain" else float(np.round(vr.uniform(0.005, 0.1), 3))
    optim = str(rng.choice(("rowwise_adagrad", "adam", "sgd", "mixed", "none")))
    total = sum(tbytes(t) for t in tables)
    ddr = int(max(256 * GiB, 4 * total / world))
    return W(seed, family, tables, world, local, hbm_gib, batch, times, optim, ddr)


# ------------------------------------------------------------------ TorchRec inputs

def build_model(w: W):
    import torch
    from torch import nn
    from torchrec import EmbeddingBagCollection, EmbeddingCollection
    from torchrec.modules.embedding_configs import DataType, EmbeddingBagConfig, EmbeddingConfig, PoolingType
    from torchrec.optim.apply_optimizer_in_backward import apply_optimizer_in_backward
    from torchrec.optim.rowwise_adagrad import RowWiseAdagrad

    def feats(t):
        return [f"{t.name}__f{j}" for j in range(t.features)]

    def dt(t):
        return DataType.FP16 if t.fp16 else DataType.FP32

    model = nn.Module()
    sparse = nn.Module()
    model.sparse = sparse
    ebc = [EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=feats(t),
                              data_type=dt(t), pooling=PoolingType.SUM) for t in w.tables if t.module == "ebc"]
    wbc = [EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=feats(t),
                              data_type=dt(t), pooling=PoolingType.MEAN) for t in w.tables if t.module == "wbc"]
    ec = [EmbeddingConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows, feature_names=feats(t),
                          data_type=dt(t)) for t in w.tables if t.module == "ec"]
    meta = torch.device("meta")
    if ebc:
        sparse.ebc = EmbeddingBagCollection(tables=ebc, device=meta)
    if wbc:
        sparse.wbc = EmbeddingBagCollection(tables=wbc, is_weighted=True, device=meta)
    if ec:
        model.seq = nn.Module()
        model.seq.ec = EmbeddingCollection(tables=ec, device=meta)
    model.dense = nn.Linear(64, 64, device=meta)
    classes = {"rowwise_adagrad": (RowWiseAdagrad, {"lr": 0.01}), "adam": (torch.optim.Adam, {"lr": 0.01}),
               "sgd": (torch.optim.SGD, {"lr": 0.01})}
    mods = [m for m in (getattr(sparse, "ebc", None), getattr(sparse, "wbc", None),
                        getattr(getattr(model, "seq", None), "ec", None)) if m is not None]
    for i, m in enumerate(mods):
        if w.optim == "none":
            continue
        key = w.optim if w.optim != "mixed" else ("rowwise_adagrad", "adam", "sgd")[i % 3]
        cls, kw = classes[key]
        apply_optimizer_in_backward(cls, m.parameters(), kw)
    return model


def constraints(w: W, load_factors: dict[str, float | None] | None = None, kernel_of: dict | None = None,
                every_cache_params: bool = False) -> dict:
    """Fresh ParameterConstraints (TorchRec's scale-up proposer mutates CacheParams in place)."""
    import torch
    from torchrec.distributed.planner.shard_estimators import EmbeddingOffloadStats
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import CacheParams

    Zipf, Noisy = make_stats_classes()
    out = {}
    for t in w.tables:
        draws = w.batch * w.world * t.pooling * t.features
        lookups = zipf_distinct(t.rows, t.alpha, draws)
        stats = None
        if t.stats_kind == "zipf":
            stats = Zipf(t.rows, t.alpha, lookups)
        elif t.stats_kind == "offload":
            edges = np.linspace(0, 1, 101)
            hits = np.array([1 - zipf_miss(f, t.rows, t.alpha) for f in edges])
            hist = torch.tensor(np.round(np.diff(hits) * 1e6), dtype=torch.float64)
            cacheability = float(np.mean([zipf_miss(f, t.rows, t.alpha) for f in edges]))
            stats = EmbeddingOffloadStats(cacheability, int(lookups), hist, t.rows)
        elif t.stats_kind == "noisy":
            # crc32, not hash(): str hashes change with every process (PYTHONHASHSEED)
            r = np.random.default_rng(zlib.crc32(t.name.encode()) + w.seed)
            xs = np.linspace(0, 1, 21)
            ys = np.array([zipf_miss(f, t.rows, t.alpha) for f in xs])
            ys = np.clip(ys + r.normal(0, 0.02, len(xs)) * (xs > 0) * (xs < 1), 0, 1)
            stats = Noisy(xs, ys, lookups)
        lf = t.load_factor if load_factors is None else load_factors.get(t.name, t.load_factor)
        given = stats is not None or lf is not None or every_cache_params
        cp = CacheParams(load_factor=lf, stats=stats) if given else None
        kernels = list(t.kernels) if t.kernels else None
        shardings = list(t.shardings) if t.shardings else None
        if kernel_of is not None and t.name in kernel_of:  # rating: exactly the plan's type and kernel
            shardings, kernels = [kernel_of[t.name][0]], [kernel_of[t.name][1]]
        out[t.name] = ParameterConstraints(
            sharding_types=shardings, compute_kernels=kernels,
            pooling_factors=[t.pooling] * t.features, cache_params=cp)
    return out


def topology(w: W):
    from torchrec.distributed.planner.types import Topology

    return Topology(world_size=w.world, local_world_size=w.local, compute_device="cuda",
                    hbm_cap=int(w.hbm_gib * GiB), ddr_cap=w.ddr)


def sharders():
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    return [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]


# ------------------------------------------------------------------ the rater (TorchRec's own estimators)

@dataclass
class Rated:
    cp: float
    over: list[int]
    perf: list[float]
    hbm: list[int]
    cap: int
    kernels: dict[str, int] = field(default_factory=dict)
    lfs: list[float] = field(default_factory=list)


def rate(sharding_plan, w: W) -> Rated:
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.perf_models import NoopPerfModel
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation

    lfs, kernel_of, plan_of = {}, {}, {}
    for path, mp in sharding_plan.plan.items():
        for name, p in mp.items():
            plan_of[(path, name)] = p
            kernel_of[name] = (p.sharding_type, p.compute_kernel)
            lfs[name] = p.cache_params.load_factor if p.cache_params is not None else None
    assert len(plan_of) == len(w.tables), (len(plan_of), len(w.tables))
    cons = constraints(w, lfs, kernel_of)
    topo = topology(w)
    model = build_model(w)
    sh = sharders()
    enum = EmbeddingEnumerator(topology=topo, batch_size=w.batch, constraints=cons,
                               estimator=[EmbeddingPerfEstimator(topo, cons), EmbeddingStorageEstimator(topo, cons)])
    opts = enum.enumerate(model, sh)
    reserved = HeuristicalStorageReservation(percentage=0.15).reserve(topo, w.batch, model, sh, cons)
    chosen = []
    for o in opts:
        p = plan_of[(o.path, o.name)]
        if (o.sharding_type, o.compute_kernel) != (p.sharding_type, p.compute_kernel):
            continue
        if p.sharding_spec is None:
            ranks = list(p.ranks)
        else:
            pool = [(tuple(s.shard_offsets), tuple(s.shard_sizes), s.placement.rank()) for s in p.sharding_spec.shards]
            ranks = []
            for s in o.shards:
                hit = next(i for i, q in enumerate(pool) if q[0] == tuple(s.offset) and q[1] == tuple(s.size))
                ranks.append(pool.pop(hit)[2])
            assert not pool, f"{o.name}: plan has extra shards"
        assert len(ranks) == len(o.shards), (o.name, len(ranks), len(o.shards))
        for s, r in zip(o.shards, ranks, strict=True):
            s.rank = r
        chosen.append(o)
    names = {o.name for o in chosen}
    assert len(chosen) == len(w.tables), f"rater matched {len(chosen)} of {len(w.tables)}: " \
        f"missing {[t.name for t in w.tables if t.name not in names][:5]}"
    perf = [0.0] * w.world
    hbm = [0] * w.world
    for o in chosen:
        for s in o.shards:
            perf[s.rank] += s.perf.total
            hbm[s.rank] += s.storage.hbm
    cp = NoopPerfModel(topo).rate(chosen)
    assert abs(cp - max(perf)) <= 1e-9 * max(perf) + 1e-12
    caps = [d.storage.hbm for d in reserved.devices]
    over = [r for r in range(w.world) if hbm[r] > caps[r]]
    kinds: dict[str, int] = {}
    for o in chosen:
        kinds[o.compute_kernel] = kinds.get(o.compute_kernel, 0) + 1
    cached = [float(lf) if (lf := lfs[o.name]) is not None else float("nan") for o in chosen
              if o.compute_kernel == "fused_uvm_caching"]
    return Rated(cp, over, perf, hbm, caps[0], kinds, cached)


# ------------------------------------------------------------------ planning

def plan_all(w: W, trec_timeout: int, sf_timeout: float | None, which=("shardflow", "default", "scaleup", "dp")):
    from torchrec.distributed.planner import EmbeddingShardingPlanner
    from torchrec.distributed.planner.perf_models import NoopPerfModel
    from torchrec.distributed.planner.proposers import (
        DynamicProgrammingProposer,
        EmbeddingOffloadScaleupProposer,
        GreedyProposer,
    )

    from rec.torchrec import ShardflowPlanner

    makers = {
        "shardflow": lambda: ShardflowPlanner(topology=topology(w), batch_size=w.batch, constraints=constraints(w),
                                              debug=False,
                                              **({"timeout_seconds": sf_timeout} if sf_timeout else {})),
        "default": lambda: EmbeddingShardingPlanner(topology=topology(w), batch_size=w.batch,
                                                    constraints=constraints(w), timeout_seconds=trec_timeout),
        # TorchRec's scale-up proposer asserts cache_params on every cached option: give every table one
        "scaleup": lambda: EmbeddingShardingPlanner(topology=topology(w), batch_size=w.batch,
                                                    constraints=constraints(w, every_cache_params=True),
                                                    timeout_seconds=trec_timeout,
                                                    proposer=[GreedyProposer(), EmbeddingOffloadScaleupProposer()]),
        "scaleup_only": lambda: EmbeddingShardingPlanner(topology=topology(w), batch_size=w.batch,
                                                         constraints=constraints(w, every_cache_params=True),
                                                         timeout_seconds=trec_timeout,
                                                         proposer=[EmbeddingOffloadScaleupProposer()]),
        "dp": lambda: EmbeddingShardingPlanner(topology=topology(w), batch_size=w.batch, constraints=constraints(w),
                                               timeout_seconds=trec_timeout, proposer=DynamicProgrammingProposer()),
    }
    out = {}
    for name in which:
        model = build_model(w)
        t0 = time.perf_counter()
        try:
            planner = quiet(makers[name])
            plan = quiet(planner.plan, model, sharders())
        except Exception as e:
            out[name] = {"error": f"{type(e).__name__}: {' '.join(str(e).split())[:600]}",
                         "seconds": time.perf_counter() - t0}
            if not type(e).__name__ == "InputError":
                out[name]["trace"] = traceback.format_exc()[-1500:]
            continue
        secs = time.perf_counter() - t0
        try:
            r = quiet(rate, plan, w)
        except Exception as e:
            out[name] = {"rate_error": f"{type(e).__name__}: {e}", "seconds": secs,
                         "trace": traceback.format_exc()[-1500:]}
            continue
        row = {"seconds": round(secs, 2), "cp": r.cp, "over": r.over, "kernels": r.kernels,
               "cached_lfs": [round(x, 4) for x in r.lfs][:40],
               "max_hbm_frac": max(r.hbm) / r.cap if r.cap else None}
        if name == "shardflow":
            row["own_cp"] = planner.last_plan.metrics.critical_path
        else:
            best = getattr(planner, "_best_plan", None)
            if best:
                row["internal_cp"] = float(NoopPerfModel(topology(w)).rate(best))
        out[name] = row
    return out


def summarize(w: W, res: dict) -> dict:
    s = {"seed": w.seed, "name": w.name, "variant": VARIANT, "tables": len(w.tables), "world": w.world,
         "local": w.local, "hbm_gib": w.hbm_gib, "batch": w.batch, "times_hbm": round(w.times_hbm, 2), "optim": w.optim,
         "modules": {m: sum(t.module == m for t in w.tables) for m in ("ebc", "wbc", "ec")}}
    theirs = {k: v for k, v in res.items() if k != "shardflow" and "cp" in v and not v["over"]}
    ours = res.get("shardflow", {})
    if "cp" in ours and theirs:
        best = min(theirs, key=lambda k: theirs[k]["cp"])
        s["ratio"] = ours["cp"] / theirs[best]["cp"]
        s["best"] = best
    else:
        s["ratio"] = None
    return s


def bad_cache() -> None:
    from rec.torchrec import ShardflowPlanner

    w = workload(50001)
    for lf in (0, 0.0, -0.5, 1.5, float("nan"), float("inf"), 1.0):
        for stats in (False, True):
            for kernels in (None, ("fused_uvm_caching",)):
                t0 = w.tables[0]
                w2 = copy.deepcopy(w)
                w2.tables[0].load_factor = lf
                if not stats:
                    w2.tables[0].stats_kind = "none"
                w2.tables[0].kernels = kernels
                c = constraints(w2)
                stage = "init"
                try:
                    p = quiet(ShardflowPlanner, topology=topology(w2), batch_size=w2.batch, constraints=c,
                              debug=False, timeout_seconds=5)
                    stage = "plan"
                    plan = quiet(p.plan, build_model(w2), sharders())
                    lfp = [pp.cache_params.load_factor for mp in plan.plan.values() for n, pp in mp.items()
                           if n == t0.name and pp.cache_params]
                    print(f"lf={lf!r} stats={stats} kernels={kernels}: PLANNED (no error); table's lf in plan {lfp}")
                except Exception as e:
                    print(f"lf={lf!r} stats={stats} kernels={kernels}: {stage} raised {type(e).__name__}: "
                          f"{' '.join(str(e).split())[:300]}")


def probe_parser(first_seed: int, count: int, out: str) -> argparse.ArgumentParser:
    """The options every drop-in probe takes: its seeds, where their lines go, the planners' limits."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--first-seed", type=int, default=first_seed)
    ap.add_argument("--count", type=int, default=count)
    ap.add_argument("--out", type=Path, default=Path(out))
    ap.add_argument("--trec-timeout", type=int, default=60)
    ap.add_argument("--sf-timeout", type=float, default=None)
    ap.add_argument("--describe", action="store_true")
    ap.add_argument("--one", type=int)
    ap.add_argument("--which", default="shardflow,default,scaleup,scaleup_only,dp")
    return ap


def main() -> int:
    ap = probe_parser(50000, 60, "out/dropin_memory_tight_probe.jsonl")
    ap.add_argument("--bad-cache", action="store_true")
    ap.add_argument("--variant", default="mixed", choices=("mixed", "plain", "floors"))
    a = ap.parse_args()
    global VARIANT
    VARIANT = a.variant
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    if a.bad_cache:
        bad_cache()
        return 0
    seeds = [a.one] if a.one is not None else range(a.first_seed, a.first_seed + a.count)
    if a.describe:
        for s in seeds:
            w = workload(s)
            print(s, w.family, len(w.tables), f"{w.world}x{w.hbm_gib}GiB", "b", w.batch, f"x{w.times_hbm:.2f}",
                  w.optim, {m: sum(t.module == m for t in w.tables) for m in ("ebc", "wbc", "ec")})
        return 0
    done = set()
    if a.one is None:
        a.out.parent.mkdir(parents=True, exist_ok=True)
    if a.out.exists() and a.one is None:
        done = {json.loads(line)["summary"]["seed"] for line in a.out.read_text().splitlines() if line.strip()}
    for s in seeds:
        if s in done:
            continue
        w = workload(s)
        res = plan_all(w, a.trec_timeout, a.sf_timeout, tuple(a.which.split(",")))
        summ = summarize(w, res)
        line = {"summary": summ, "planners": res}
        brief = " ".join(f"{k}=ERR" if "cp" not in v else f"{k}={v['cp']:.4g}{'(OVER)' if v['over'] else ''}"
                         f"[{v['seconds']}s]" for k, v in res.items())
        r = summ["ratio"]
        print(f"{w.name:>18} {len(w.tables):>3}t {w.world:>2}x{w.hbm_gib:g}GiB b{w.batch:<5} x{w.times_hbm:.1f} "
              f"ratio={'None' if r is None else f'{r:.4f}'} {brief}", flush=True)
        record(res, line, a.out, a.one)
    return 0


def record(res: dict, line: dict, out: Path, one: int | None) -> None:
    """Each planner's failure, a line each; the workload's line appended to ``out`` (``--one``: printed)."""
    for k, v in res.items():
        if "cp" not in v:
            print(f"    {k}: {v.get('error') or v.get('rate_error')}", flush=True)
    if one is None:
        with out.open("a") as f:
            f.write(json.dumps(line, default=str) + "\n")
    else:
        print(json.dumps(line, default=str, indent=1))


if __name__ == "__main__":
    sys.exit(main())
