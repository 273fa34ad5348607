"""Five more memory-tight families for the drop-in ShardflowPlanner against TorchRec's best.

Reuses bench/dropin_probe_new_families.py (its run_one, user settings, the DDR-checking rater and
bandwidth topology, which it patches into bench/dropin_memory_tight_probe.py on import) and the old
probe's model building / constraints, each rebound here for two new knobs:
  * ``build_model``: several modules of each kind (ebc0, ebc1, wbc0, ec0, ec1 ...), each with its own
    optimizer (adagrad / rowwise_adagrad / sgd / adam / none) -> optimizers per table;
  * ``constraints``: per-feature pooling factors (``pf``) and ``min_partition``.
Seeds 70000-70999; family by ``seed % 5``:

  0 swarm_giants  : 120-320 tiny/small tables (dims 8-64) beside 1-4 giants each 0.5-3x a rank's HBM,
                    on 8/12/16 ranks; 1.2-4x the HBM
  1 seq_pool_heavy: sequence tables of one small dim (8-24) with 50-500 ids a sample beside pooled tables
                    with pooling 20-300 and dims 8-32; 1.5-8x
  2 odd_dims_worlds: dims 12/20/24/40/100/200/300/600, worlds 3/5/6/7/10/12/14 with odd local sizes,
                    column-wise allow-lists (some min_partition) on a third of the tables; 1.5-8x
  3 barely_fits   : the tables plus their optimizer state 0.65-1.0x of the ranks' HBM left after
                    TorchRec's 15% reservation (HBM cap at 1.0-1.55x the footprint), modules with own optimizers
  4 multi_opt_feat: 2-5 modules with own optimizers, tables of 1-6 features with per-feature pooling
                    factors (all >= 1 or all <= 1), extreme or flat skew, statistics on ~40% only; 2-8x

    PYTHONHASHSEED=0 PYTHONPATH=. python bench/dropin_probe_odd_shapes.py --first-seed 70000 --count 5 --out OUT
    PYTHONHASHSEED=0 PYTHONPATH=. python bench/dropin_probe_odd_shapes.py --one 70003
"""

from __future__ import annotations

import logging
import math
import sys
import warnings
from dataclasses import dataclass, field

import numpy as np

import bench.dropin_memory_tight_probe as P
import bench.dropin_probe_new_families as NF  # patches P.topology / P.rate
from bench.dropin_memory_tight_probe import GiB, T

OPT_MULT = {"adam": 2.0, "adagrad": 1.0, "rowwise_adagrad": 0.02, "sgd": 0.0, "none": 0.0}


@dataclass
class T7(T):
    pf: list | None = None  # per-feature pooling factors
    min_partition: int | None = None


@dataclass
class W7(NF.W2):
    opt_of: dict = field(default_factory=dict)  # module -> optimizer


# ------------------------------------------------------------------ rebinds

def build_model(w):
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

    meta = torch.device("meta")
    model = nn.Module()
    model.sparse = nn.Module()
    model.seq = nn.Module()
    classes = {"rowwise_adagrad": (RowWiseAdagrad, {"lr": 0.01}), "adam": (torch.optim.Adam, {"lr": 0.01}),
               "sgd": (torch.optim.SGD, {"lr": 0.01}), "adagrad": (torch.optim.Adagrad, {"lr": 0.01})}
    mods = sorted({t.module for t in w.tables})
    for i, mname in enumerate(mods):
        ts = [t for t in w.tables if t.module == mname]
        if mname.startswith("ec"):
            m = EmbeddingCollection(tables=[EmbeddingConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                                            feature_names=feats(t), data_type=dt(t)) for t in ts],
                                    device=meta)
            setattr(model.seq, mname, m)
        else:
            weighted = mname.startswith("wbc")
            m = EmbeddingBagCollection(
                tables=[EmbeddingBagConfig(name=t.name, embedding_dim=t.dim, num_embeddings=t.rows,
                                           feature_names=feats(t), data_type=dt(t),
                                           pooling=PoolingType.MEAN if weighted else PoolingType.SUM) for t in ts],
                is_weighted=weighted, device=meta)
            setattr(model.sparse, mname, m)
        opt = getattr(w, "opt_of", {}).get(mname)
        if opt is None:
            opt = w.optim if w.optim != "mixed" else ("rowwise_adagrad", "adam", "sgd")[i % 3]
        if opt in classes:
            cls, kw = classes[opt]
            apply_optimizer_in_backward(cls, m.parameters(), kw)
    model.dense = nn.Linear(64, 64, device=meta)
    return model


_orig_constraints = P.constraints


def constraints(w, load_factors=None, kernel_of=None, every_cache_params=False):
    out = _orig_constraints(w, load_factors, kernel_of, every_cache_params)
    for t in w.tables:
        if getattr(t, "pf", None):
            out[t.name].pooling_factors = [float(x) for x in t.pf]
        if getattr(t, "min_partition", None):
            out[t.name].min_partition = int(t.min_partition)
    return out


P.build_model = build_model
P.constraints = constraints


# ------------------------------------------------------------------ families

def f_swarm_giants(rng, world, hbm):
    out = []
    for i in range(int(rng.integers(1, 5))):
        out.append(T7(f"giant{i}", 1, int(rng.choice((32, 64, 96, 128, 256))), bool(rng.random() < 0.5),
                      float(rng.uniform(1, 30)), float(rng.uniform(0.5, 1.5)), module="ebc0"))
    for i in range(int(rng.integers(120, 320))):
        out.append(T7(f"s{i}", int(10 ** rng.uniform(1.5, 4.8)), int(rng.choice((8, 12, 16, 24, 32, 48, 64))),
                      bool(rng.random() < 0.4), float(rng.choice((1, 1, 1, 2, 3, 5, 10))),
                      float(rng.uniform(0.3, 1.6)), module="ebc0" if rng.random() < 0.8 else "wbc0",
                      scalable=False))
    # giants: each 0.5-3x a rank's HBM, the rest of the target spread proportionally
    shares = [rng.uniform(0.5, 3.0) for _ in range(sum(t.name.startswith("giant") for t in out))]
    k = 0
    for t in out:
        if t.name.startswith("giant"):
            t.rows = int(shares[k] * hbm * GiB / (t.dim * (2 if t.fp16 else 4)))
            k += 1
    return out


def f_seq_pool_heavy(rng, world, hbm):
    sd = int(rng.choice((8, 12, 16, 20, 24)))
    out = [T7(f"seq{i}", int(10 ** rng.uniform(5, 8.5)), sd, bool(rng.random() < 0.5), float(rng.uniform(50, 500)),
              float(rng.uniform(0.4, 1.6)), module="ec0", features=int(rng.integers(1, 3)))
           for i in range(int(rng.integers(2, 10)))]
    out += [T7(f"hp{i}", int(10 ** rng.uniform(4, 8.5)), int(rng.choice((8, 12, 16, 24, 32))),
               bool(rng.random() < 0.5), float(rng.uniform(20, 300)), float(rng.uniform(0.4, 1.6)),
               module="ebc0" if rng.random() < 0.7 else "wbc0")
            for i in range(int(rng.integers(4, 30)))]
    out += [T7(f"lp{i}", int(10 ** rng.uniform(3, 7)), int(rng.choice((16, 32, 64))), bool(rng.random() < 0.5),
               1.0, float(rng.uniform(0.5, 1.3)), module="ebc0") for i in range(int(rng.integers(0, 10)))]
    for t in out:
        t.scalable = t.rows > 100_000
    return out


ODD = (12, 20, 24, 40, 100, 200, 300, 600)


def f_odd_dims(rng, world, hbm):
    out = []
    for i in range(int(rng.integers(10, 60))):
        rows = int(np.clip(rng.lognormal(14, 2.3), 100, 3e9))
        t = T7(f"o{i}", rows, int(rng.choice(ODD)), bool(rng.random() < 0.5),
               float(np.clip(rng.pareto(1.0) + 1, 1, 100)), float(rng.uniform(0.3, 1.6)),
               module="ec0" if rng.random() < 0.1 else ("wbc0" if rng.random() < 0.15 else "ebc0"),
               features=int(rng.integers(1, 3)), scalable=rows > 100_000)
        out.append(t)
    return out


def f_barely(rng, world, hbm):
    out = []
    for i in range(int(rng.integers(8, 50))):
        rows = int(np.clip(rng.lognormal(14.5, 2.0), 100, 3e9))
        out.append(T7(f"b{i}", rows, int(rng.choice((16, 24, 32, 48, 64, 128, 256))), bool(rng.random() < 0.5),
                      float(np.clip(rng.lognormal(0.8, 1.1), 1, 80)), float(rng.uniform(0.3, 1.6)),
                      module=str(rng.choice(("ebc0", "ebc1", "ebc2", "wbc0", "ec0"), p=(0.35, 0.25, 0.15, 0.15, 0.1))),
                      scalable=rows > 50_000))
    return out


def f_multi_opt_feat(rng, world, hbm):
    mods = ["ebc0"] + [str(m) for m in rng.choice(("ebc1", "ebc2", "wbc0", "wbc1", "ec0", "ec1"),
                                                     size=int(rng.integers(1, 5)), replace=False)]
    out = []
    for i in range(int(rng.integers(10, 60))):
        rows = int(np.clip(rng.lognormal(14, 2.3), 100, 3e9))
        nf = int(rng.choice((1, 1, 2, 3, 4, 6)))
        alpha = float(rng.uniform(1.3, 2.0) if rng.random() < 0.5 else rng.uniform(0.02, 0.3))
        if rng.random() < 0.3:  # sparse features: all <= 1
            pf = [float(np.round(rng.uniform(0.05, 1.0), 3)) for _ in range(nf)]
        else:
            pf = [float(np.round(np.clip(rng.lognormal(1.0, 1.2), 1, 150), 2)) for _ in range(nf)]
        t = T7(f"m{i}", rows, int(rng.choice((8, 16, 32, 64, 128, 256))), bool(rng.random() < 0.5),
               float(np.mean(pf)), alpha, module=str(rng.choice(mods)), features=nf, scalable=rows > 100_000)
        t.pf = pf if nf > 1 and rng.random() < 0.7 else None
        if t.pf is None:  # one factor for all features: TorchRec's count is that one factor in total
            t.pooling = float(np.sum(pf)) / nf if rng.random() < 0.5 else float(pf[0])
        out.append(t)
    return out


FAMS = ["swarm_giants", "seq_pool_heavy", "odd_dims_worlds", "barely_fits", "multi_opt_feat"]
OPTS = ("rowwise_adagrad", "adam", "sgd", "adagrad", "none")


def workload(seed: int) -> W7:
    assert 70000 <= seed < 71000
    rng = np.random.default_rng(seed)
    fam = FAMS[seed % 5]
    mode = str(rng.choice(("mixed", "mixed", "plain", "floors")))
    if fam == "swarm_giants":
        world = int(rng.choice((8, 12, 16)))
        local = 8 if world != 12 else int(rng.choice((4, 6)))
    elif fam == "odd_dims_worlds":
        world = int(rng.choice((3, 5, 6, 7, 10, 12, 14)))
        locals_of = {3: (3,), 5: (5,), 6: (2, 3, 6), 7: (7,), 10: (5, 2), 12: (4, 6, 3), 14: (7, 2)}
        local = int(rng.choice(locals_of[world]))
    else:
        world = int(rng.choice((2, 3, 4, 6, 8, 8, 12, 16)))
        local = world if world <= 8 else (4 if world == 12 else 8)
    hbm_gib = float(np.round(np.exp(rng.uniform(math.log(2), math.log(80))), 2))
    tables = {"swarm_giants": f_swarm_giants, "seq_pool_heavy": f_seq_pool_heavy, "odd_dims_worlds": f_odd_dims,
              "barely_fits": f_barely, "multi_opt_feat": f_multi_opt_feat}[fam](rng, world, hbm_gib)
    P.one_dim_per_ec(tables)
    mods = sorted({t.module for t in tables})
    if fam in ("barely_fits", "multi_opt_feat"):
        opt_of = {m: str(rng.choice(OPTS)) for m in mods}
        optim = "per_module"
    else:
        optim = str(rng.choice((*OPTS, "mixed")))
        opt_of = {}
    if fam == "swarm_giants":  # the giants take what the small tables leave of 1.2-4x the HBM
        NF._scale(tables, float(rng.uniform(1.2, 4.0)) * world * hbm_gib * GiB)
    elif fam == "barely_fits":
        NF._scale(tables, float(rng.uniform(1, 3)) * world * hbm_gib * GiB)
    else:
        NF._scale(tables, float(rng.uniform(1.5, 8.0)) * world * hbm_gib * GiB)
    for t in tables:
        t.rows = max(2, t.rows)
    ids = sum(t.pooling * t.features for t in tables)
    batch = int(2 ** rng.integers(8, 15))
    while batch > 64 and 20 * 8 * ids * batch > 0.25 * hbm_gib * GiB:
        batch //= 2
    NF._user_settings(rng, tables, mode, partial=(fam == "multi_opt_feat"))
    if fam == "odd_dims_worlds":
        for t in tables:
            if rng.random() < 0.33:
                opts = [("column_wise",), ("table_column_wise",), ("column_wise", "row_wise"),
                        ("table_column_wise", "table_wise"), ("column_wise", "table_wise", "row_wise")]
                t.shardings = opts[int(rng.integers(0, len(opts)))]
                if rng.random() < 0.4:
                    t.min_partition = int(rng.choice((4, 8, 10, 20, 40)))
    for t in tables:  # EmbeddingCollection: no table_row_wise / table_column_wise
        if t.module.startswith("ec") and t.shardings:
            t.shardings = tuple(x for x in t.shardings if not x.startswith("table_")) or ("row_wise",)

    def mult(t):
        o = opt_of.get(t.module, optim)
        if o == "mixed":
            o = ("rowwise_adagrad", "adam", "sgd")[mods.index(t.module) % 3]
        return OPT_MULT.get(o, 0.0)

    foot = sum(P.tbytes(t) * (1 + mult(t)) for t in tables)
    note = ""
    if fam == "barely_fits":
        # HBM cap so the footprint is 1/f of what TorchRec's 15% reservation leaves, f in 1.0-1.55
        f = float(rng.uniform(1.0, 1.55))
        hbm_gib = float(np.round(f * foot / world / 0.85 / GiB, 3))
        note = f"hbm={f:.2f}x footprint/0.85"
        ids = sum(t.pooling * t.features for t in tables)
        while batch > 64 and 20 * 8 * ids * batch > 0.1 * hbm_gib * GiB:
            batch //= 2
    times = sum(P.tbytes(t) for t in tables) / (world * hbm_gib * GiB)
    ddr = int(max(256 * GiB, 4 * foot / world))
    return W7(seed, fam, tables, world, local, hbm_gib, batch, times, optim, ddr, mode=mode, ddr_note=note,
              opt_of=opt_of)


# ------------------------------------------------------------------ run

def _note(w: W7, summary: dict) -> None:
    summary["opt_of"] = w.opt_of
    summary["modules"] = {m: sum(t.module == m for t in w.tables) for m in sorted({t.module for t in w.tables})}


def main() -> int:
    ap = NF.probe_parser(70000, "out/dropin_probe_odd_shapes.jsonl")
    ap.add_argument("--families", default=None, help="comma list: only these families")
    a = ap.parse_args()
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    seeds = [a.one] if a.one is not None else range(a.first_seed, a.first_seed + a.count)
    if a.families and a.one is None:
        keep = set(a.families.split(","))
        seeds = [s for s in seeds if FAMS[s % 5] in keep]
    if a.describe:
        for s in seeds:
            w = workload(s)
            print(s, w.family, w.mode, len(w.tables), f"{w.local}x{w.world // w.local}h {w.hbm_gib}GiB", "b", w.batch,
                  f"x{w.times_hbm:.2f}", w.optim, w.opt_of, w.ddr_note,
                  {m: sum(t.module == m for t in w.tables) for m in sorted({t.module for t in w.tables})})
        return 0
    NF.run_seeds(seeds, a, workload, note=_note)
    return 0


if __name__ == "__main__":
    sys.exit(main())
