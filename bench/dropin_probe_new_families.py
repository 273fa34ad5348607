"""New memory-tight workload families for the drop-in ShardflowPlanner against TorchRec's best proposer.

Written by a probe of the thirty-eighth session (bench/RESULTS.md §15), which found one workload
above TorchRec's best (wide_narrow-60091, 1.0011: a plan within 1% of its bound that the exact stage
left as it was; the finished plan's last look, ``rec.planning``, since). Reuses
bench/dropin_memory_tight_probe.py's model building, constraints (CacheParams + statistics),
planners (plan_all) and rater (rate), and rebinds that module's ``topology`` (to take bandwidths)
and ``rate`` (to check each rank's DDR too) when imported: run it as a script. Only the workload
generator is new. Seeds 60000 and up; family by ``seed % 5``:

  0 uniform_skew  : 12-80 tables of similar size (x0.8-1.25), 1-3 dims, bimodal skew (alpha 1.3-2.2 or 0.05-0.4)
  1 wide_narrow   : 3-15 very wide tables (dim 512-2048, 1e3-1e6 rows) beside 2-8 narrow huge ones (dim 4-16)
  2 multihost     : 2-4 hosts x 2/4/8 GPUs, non-default intra/inter-host (and sometimes hbm<->ddr, ddr) bandwidths
  3 tight_ddr     : per-rank ddr_cap only 0.9-2.0x of what the offloaded tables (+ optimizer state) need
  4 partial_batch : statistics on ~40% of tables, load factors on ~30%, allow-lists (caching, uvm, fused,
                    column-wise, data-parallel) on a few; batch 256-1024 or 32768-65536

Each workload also draws a user-settings mode (mixed / plain / floors, as the old probe's variants) and an
optimizer (rowwise_adagrad / adam / sgd / mixed / none). Beside the old probe's HBM check, each plan's
per-rank DDR use (TorchRec's own storage estimate, read from the rater's chosen options) is checked
against ddr_cap.

    PYTHONHASHSEED=0 .venv/bin/python bench/dropin_probe_new_families.py --first-seed 60000 --count 5 --out OUT
    PYTHONHASHSEED=0 .venv/bin/python bench/dropin_probe_new_families.py --one 60091
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import sys
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

import bench.dropin_memory_tight_probe as P
from bench.dropin_memory_tight_probe import GiB, T, W

WIDE = (512, 768, 1024, 1280, 1536, 2048)
NARROW = (4, 8, 12, 16)
MID = (16, 24, 32, 48, 64, 96, 128, 160, 256)


@dataclass
class W2(W):
    bw: dict = field(default_factory=dict)  # extra Topology keywords (bandwidths)
    mode: str = "mixed"
    ddr_note: str = ""


# ------------------------------------------------------------------ patches (no rater code duplicated)


def topology(w):
    from torchrec.distributed.planner.types import Topology

    return Topology(world_size=w.world, local_world_size=w.local, compute_device="cuda",
                    hbm_cap=int(w.hbm_gib * GiB), ddr_cap=w.ddr, **getattr(w, "bw", {}))


P.topology = topology  # plan_all, rate and the planners all look it up in the module at call time

_orig_rate = P.rate
DDR_LOG: list[dict] = []  # one entry per successful rating, in plan_all's order


def rate_with_ddr(plan, w):
    """P.rate, plus each rank's DDR (TorchRec's storage estimate of the options the rater chose)."""
    from torchrec.distributed.planner import perf_models

    seen = {}
    orig_cls = perf_models.NoopPerfModel

    class Spy(orig_cls):
        def rate(self, plan_opts):
            seen["opts"] = plan_opts
            return super().rate(plan_opts)

    perf_models.NoopPerfModel = Spy
    try:
        r = _orig_rate(plan, w)
    finally:
        perf_models.NoopPerfModel = orig_cls
    ddr = [0] * w.world
    for o in seen["opts"]:
        for s in o.shards:
            ddr[s.rank] += s.storage.ddr
    DDR_LOG.append({"max_ddr_frac": max(ddr) / w.ddr, "ddr_over": [i for i in range(w.world) if ddr[i] > w.ddr]})
    return r


P.rate = rate_with_ddr


# ------------------------------------------------------------------ families

def f_uniform_skew(rng):
    n = int(rng.integers(12, 80))
    base = 10 ** rng.uniform(6, 8)
    dims = [int(d) for d in rng.choice(MID, size=int(rng.integers(1, 4)))]
    hi_share = rng.uniform(0.2, 0.8)
    out = []
    for i in range(n):
        alpha = rng.uniform(1.3, 2.2) if rng.random() < hi_share else rng.uniform(0.05, 0.4)
        out.append(T(f"u{i}", int(base * rng.uniform(0.8, 1.25)), int(rng.choice(dims)), bool(rng.random() < 0.5),
                     float(rng.choice((1, 1, 2, 5, 10, 30))), float(alpha),
                     module="ec" if rng.random() < 0.1 else "ebc"))
    return out


def f_wide_narrow(rng):
    out = [T(f"wide{i}", int(10 ** rng.uniform(3, 6)), int(rng.choice(WIDE)), bool(rng.random() < 0.5),
             float(rng.choice((1, 1, 2, 3))), float(rng.uniform(0.4, 1.5)), scalable=False,
             module="wbc" if rng.random() < 0.2 else "ebc")
           for i in range(int(rng.integers(3, 16)))]
    out += [T(f"narrow{i}", int(10 ** rng.uniform(8, 10)), int(rng.choice(NARROW)), bool(rng.random() < 0.4),
              float(rng.uniform(1, 50)), float(rng.uniform(0.5, 1.4))) for i in range(int(rng.integers(2, 9)))]
    return out


def f_mixed_pop(rng):
    """tables for the multi-host / tight-DDR families: a few big, many mid, high pooling on some."""
    out = []
    for i in range(int(rng.integers(8, 60))):
        rows = int(np.clip(rng.lognormal(14, 2.2), 100, 3e9))
        out.append(T(f"t{i}", rows, int(rng.choice((8, 16, 32, 64, 128, 256, 512))), bool(rng.random() < 0.5),
                     float(np.clip(rng.pareto(0.9) + 1, 1, 200)), float(rng.uniform(0.3, 1.6)),
                     module="ec" if rng.random() < 0.15 else ("wbc" if rng.random() < 0.15 else "ebc"),
                     features=int(rng.integers(1, 3)), scalable=rows > 100_000))
    return out


def f_partial(rng):
    out = []
    for i in range(int(rng.integers(10, 70))):
        rows = int(np.clip(rng.lognormal(13.5, 2.5), 50, 3e9))
        out.append(T(f"p{i}", rows, int(rng.choice((8, 16, 24, 32, 64, 128, 256))), bool(rng.random() < 0.5),
                     float(np.clip(rng.lognormal(0.7, 1.0), 1, 60)), float(rng.uniform(0.4, 1.5)),
                     module="ec" if rng.random() < 0.1 else "ebc", scalable=rows > 100_000))
    return out


FAMS = ["uniform_skew", "wide_narrow", "multihost", "tight_ddr", "partial_batch"]


def _scale(tables, target):
    fixed = sum(P.tbytes(t) for t in tables if not t.scalable)
    scal = sum(P.tbytes(t) for t in tables if t.scalable)
    if scal == 0:
        tables[0].scalable = True
        fixed -= P.tbytes(tables[0])
        scal = P.tbytes(tables[0])
    if fixed > 0.5 * target:
        f = 0.5 * target / fixed
        for t in tables:
            if not t.scalable:
                t.rows = max(2, int(t.rows * f))
        fixed = sum(P.tbytes(t) for t in tables if not t.scalable)
    f = (target - fixed) / scal
    for t in tables:
        if t.scalable:
            t.rows = max(2, int(t.rows * f))


def _user_settings(rng, tables, mode, partial=False):
    for t in tables:
        if mode == "mixed" or partial:
            u = rng.random()
            if partial:
                t.stats_kind = ("zipf" if u < 0.2 else "offload" if u < 0.32 else "noisy" if u < 0.4 else "none")
            else:
                t.stats_kind = "zipf" if u < 0.4 else "offload" if u < 0.65 else "noisy" if u < 0.78 else "none"
            if rng.random() < 0.32:
                t.load_factor = float(rng.choice((0.01, 0.02, 0.05, 0.1, 0.15, 0.25, 0.3, 0.5, 0.7, 0.9)))
            if rng.random() < 0.12 and t.rows > 10_000:
                t.kernels = ("fused_uvm_caching",)
            elif partial and rng.random() < 0.05 and t.rows > 10_000:
                t.kernels = ("fused_uvm",)
            elif partial and rng.random() < 0.05:
                t.kernels = ("fused", "fused_uvm")
            elif rng.random() < 0.05:
                t.kernels = ("fused", "fused_uvm_caching")
            if rng.random() < (0.15 if partial else 0.08):
                opts = [("row_wise",), ("column_wise",), ("table_column_wise", "column_wise"),
                        ("table_wise", "row_wise"), ("table_row_wise", "row_wise"), ("column_wise", "row_wise")]
                t.shardings = opts[int(rng.integers(0, len(opts)))]
                if t.module == "ec" and "table_row_wise" in t.shardings:
                    t.shardings = ("row_wise",)
        else:
            t.stats_kind = "zipf" if rng.random() < 0.5 else "offload"
            t.kernels = t.shardings = None
            t.load_factor = None if mode == "plain" else float(np.round(rng.uniform(0.005, 0.1), 3))


def _opt_mult(optim):
    return {"adam": 2.0, "mixed": 1.0, "sgd": 0.0, "none": 0.0}.get(optim, 0.05)


def workload(seed: int) -> W2:
    assert seed >= 60000
    rng = np.random.default_rng(seed)
    fam = FAMS[seed % 5]
    bw: dict = {}
    mode = str(rng.choice(("mixed", "mixed", "plain", "floors")))
    if fam == "multihost":
        local = int(rng.choice((2, 4, 8, 8)))
        world = int(rng.integers(2, 5)) * local
        bw["inter_host_bw"] = 13421772.8 * 10 ** rng.uniform(-1.2, 0.8)
        bw["intra_host_bw"] = 644245094.4 * 10 ** rng.uniform(-1.0, 0.2)
        if rng.random() < 0.5:
            bw["hbm_to_ddr_mem_bw"] = 34359738.368 * 10 ** rng.uniform(-0.7, 0.5)
        if rng.random() < 0.3:
            bw["ddr_mem_bw"] = 54760833.024 * 10 ** rng.uniform(-0.5, 0.3)
        tables = f_mixed_pop(rng)
    else:
        world = int(rng.choice((2, 4, 8, 8, 16, 16, 32)))
        local = min(world, 8)
        tables = {"uniform_skew": f_uniform_skew, "wide_narrow": f_wide_narrow, "tight_ddr": f_mixed_pop,
                  "partial_batch": f_partial}[fam](rng)
    P.one_dim_per_ec(tables)
    hbm_gib = float(np.round(np.exp(rng.uniform(math.log(2), math.log(80))), 2))
    times = float(rng.uniform(2.0, 10.0))
    _scale(tables, times * world * hbm_gib * GiB)
    times = sum(P.tbytes(t) for t in tables) / (world * hbm_gib * GiB)
    ids = sum(t.pooling * t.features for t in tables)
    if fam == "partial_batch":
        batch = int(rng.choice((256, 512, 1024))) if rng.random() < 0.5 else int(rng.choice((32768, 65536)))
        while batch > 256 and 20 * 8 * ids * batch > 0.4 * hbm_gib * GiB:
            batch //= 2
    else:
        batch = int(2 ** rng.integers(8, 15))
        while batch > 128 and 20 * 8 * ids * batch > 0.25 * hbm_gib * GiB:
            batch //= 2
    _user_settings(rng, tables, mode, partial=(fam == "partial_batch"))
    optim = str(rng.choice(("rowwise_adagrad", "adam", "sgd", "mixed", "none")))
    total = sum(P.tbytes(t) for t in tables)
    need = total * (1 + _opt_mult(optim)) / world
    note = ""
    if fam == "tight_ddr":
        f = float(rng.uniform(0.9, 2.0))
        ddr = int(f * need)
        note = f"ddr={f:.2f}x need"
        if rng.random() < 0.4:
            bw["hbm_to_ddr_mem_bw"] = 34359738.368 * 10 ** rng.uniform(-0.7, 0.3)
    else:
        ddr = int(max(256 * GiB, 4 * need))
    return W2(seed, fam, tables, world, local, hbm_gib, batch, times, optim, ddr, bw=bw, mode=mode, ddr_note=note)


# ------------------------------------------------------------------ run

def run_one(w: W2, a) -> dict:
    DDR_LOG.clear()
    res = P.plan_all(w, a.trec_timeout, a.sf_timeout, tuple(a.which.split(",")))
    rated = [k for k, v in res.items() if "cp" in v]
    assert len(rated) == len(DDR_LOG), (rated, len(DDR_LOG))
    for k, d in zip(rated, DDR_LOG, strict=True):
        res[k].update(d)
    # TorchRec's best: fits HBM and DDR
    theirs = {k: v for k, v in res.items() if k != "shardflow" and "cp" in v and not v["over"] and not v["ddr_over"]}
    s = P.summarize(w, {k: v for k, v in res.items() if k == "shardflow" or k in theirs})
    s.update(variant="new", mode=w.mode, family=w.family, bw={k: round(v / 1e6, 2) for k, v in w.bw.items()},
             ddr_gib=round(w.ddr / GiB, 2), ddr_note=w.ddr_note)
    ours = res.get("shardflow", {})
    flags = []
    if "cp" not in ours:
        flags.append("sf_error" if theirs else "sf_error_trec_too" if not any("cp" in v for k, v in res.items()
                                                                               if k != "shardflow") else "sf_error")
    else:
        if ours["over"]:
            flags.append("sf_hbm_over")
        if ours["ddr_over"]:
            flags.append("sf_ddr_over")
        if ours.get("own_cp") and abs(ours["own_cp"] / ours["cp"] - 1) > 1e-3:
            flags.append(f"own_cp_mismatch:{ours['own_cp'] / ours['cp']:.4f}")
    if s.get("ratio") is not None and s["ratio"] > 1.0001:
        flags.append("ratio_above")
    s["flags"] = flags
    return {"summary": s, "planners": res}


def planners_brief(res: dict) -> str:
    """Each planner's critical path (over HBM or DDR marked) and seconds, on one line."""
    return " ".join(f"{k}=ERR" if "cp" not in v else
                    f"{k}={v['cp']:.4g}{'(OVER)' if v['over'] else ''}{'(DDROVER)' if v['ddr_over'] else ''}"
                    f"[{v['seconds']}s]" for k, v in res.items())


def run_seeds(seeds: Iterable[int], a: argparse.Namespace, workload_of: Callable[[int], Any],
              note: Callable[[Any, dict], None] | None = None) -> None:
    """Plan and rate each of ``seeds`` not yet in ``a.out`` (none after ``a.deadline``), a line each;
    ``note`` adds to a workload's summary."""
    done = set()
    if a.one is None and a.out.exists():
        done = {json.loads(x)["summary"]["seed"] for x in a.out.read_text().splitlines() if x.strip()}
    for s in seeds:
        if s in done:
            continue
        if a.deadline and time.time() > a.deadline:
            print("deadline reached", flush=True)
            break
        w = workload_of(s)
        t0 = time.perf_counter()
        line = run_one(w, a)
        line["summary"]["wall_s"] = round(time.perf_counter() - t0, 1)
        if note is not None:
            note(w, line["summary"])
        res, summ = line["planners"], line["summary"]
        r = summ["ratio"]
        print(f"{w.name:>22} {w.mode:>6} {len(w.tables):>3}t {w.world:>2}({w.local})x{w.hbm_gib:g}GiB b{w.batch:<5} "
              f"x{w.times_hbm:.2f} {w.optim:>15} ratio={'None' if r is None else f'{r:.4f}'} {summ['flags']} "
              f"{planners_brief(res)}", flush=True)
        P.record(res, line, a.out, a.one)


def probe_parser(first_seed: int, out: str) -> argparse.ArgumentParser:
    """The old probe's options (``P.probe_parser``), five seeds by default, and a deadline."""
    ap = P.probe_parser(first_seed, 5, out)
    ap.add_argument("--deadline", type=float, default=None, help="stop starting workloads after this unix time")
    return ap


def main() -> int:
    a = probe_parser(60000, "out/dropin_probe_new_families.jsonl").parse_args()
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    seeds = [a.one] if a.one is not None else range(a.first_seed, a.first_seed + a.count)
    if a.describe:
        for s in seeds:
            w = workload(s)
            print(s, w.family, w.mode, len(w.tables), f"{w.local}x{w.world // w.local}h {w.hbm_gib}GiB", "b", w.batch,
                  f"x{w.times_hbm:.2f}", w.optim, f"ddr {w.ddr / GiB:.1f}GiB {w.ddr_note}",
                  {m: sum(t.module == m for t in w.tables) for m in ("ebc", "wbc", "ec")}, w.bw and
                  {k: f"{v / 1e6:.3g}" for k, v in w.bw.items()})
        return 0
    run_seeds(seeds, a, workload)
    return 0


if __name__ == "__main__":
    sys.exit(main())
