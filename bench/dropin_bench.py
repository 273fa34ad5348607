"""The drop-in ``ShardflowPlanner`` against TorchRec's ``EmbeddingShardingPlanner`` on TorchRec models
of multi-feature tables, both plans rated in TorchRec's units.

TorchRec counts one input per entry of a table's ``pooling_factors`` (one of 1.0 without
constraints), however many features the table has; the drop-in counts the same (docs/torchrec-planner.md).
The models come from a generator of its own, with seeds no other bench or test uses (12000 on),
and four ways of giving pooling factors: none, one factor up to 1 per table, one factor above 1 per
table (where TorchRec's one pooled output per input and shardflow's one per feature differ), and one
per feature. Each model's two plans are rated alike: TorchRec's enumerator and estimators with the
user's constraints, each table's option at the cache size its plan states, the busiest rank's time
(``NoopPerfModel``), and its memory against what TorchRec's ``HeuristicalStorageReservation`` leaves.

    .venv/bin/python bench/dropin_bench.py [--models 40] [--out bench/results/dropin_bench.json]
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

FIRST_SEED = 12000  # reserved for this bench
MODES = ("none", "one factor <= 1", "one factor > 1", "one per feature")


def model_of(seed: int) -> tuple[Any, Any, int, dict[str, Any], str]:
    """A model of one EmbeddingBagCollection (``ebc``) of 4-20 tables with 1-40 features each, on
    2-16 cuda ranks; its constraints by the seed's mode."""
    import torch
    from torch import nn
    from torchrec.distributed.planner.types import ParameterConstraints, Topology
    from torchrec.modules.embedding_configs import EmbeddingBagConfig
    from torchrec.modules.embedding_modules import EmbeddingBagCollection

    rng = np.random.default_rng(seed)
    n = int(rng.integers(4, 21))
    tables = [(f"t{i}", int(10 ** rng.uniform(3, 7.5)), int(rng.choice([16, 32, 64, 128, 256])),
               int(rng.choice([1, 1, 1, 2, 5, 20, 40]))) for i in range(n)]
    world = int(rng.choice([2, 4, 8, 16]))
    total = sum(rows * dim * 4 for _, rows, dim, _ in tables)
    hbm = max(int(total / world * float(rng.choice([0.5, 1.5, 10.0]))), 1 << 30)
    batch = int(rng.choice([256, 1024, 4096]))
    mode = MODES[(seed - FIRST_SEED) % len(MODES)]
    factor = {"one factor <= 1": lambda: [float(rng.choice([0.3, 0.7, 1.0]))],
              "one factor > 1": lambda: [float(rng.choice([3.0, 10.0]))]}
    constraints: dict[str, Any] = {}
    for name, _, _, features in tables:
        if mode in factor:
            constraints[name] = ParameterConstraints(pooling_factors=factor[mode]())
        elif mode == "one per feature":
            constraints[name] = ParameterConstraints(pooling_factors=[float(rng.choice([0.5, 2.0, 8.0]))] * features)
    model = nn.Module()
    model.ebc = EmbeddingBagCollection([EmbeddingBagConfig(
        name=name, num_embeddings=rows, embedding_dim=dim, feature_names=[f"{name}_{j}" for j in range(features)])
        for name, rows, dim, features in tables], device=torch.device("meta"))
    topology = Topology(world_size=world, local_world_size=min(world, 8), compute_device="cuda", hbm_cap=hbm)
    return model, topology, batch, constraints, mode


def rated(sharding_plan: Any, model: Any, topology: Any, batch: int, constraints: dict[str, Any],
          sharders: list[Any]) -> tuple[float, bool]:
    """TorchRec's rating of a plan: the busiest rank's estimated time, each table's option at the cache
    size the plan states; and whether a rank holds more than TorchRec's reservation leaves it."""
    from torchrec.distributed.planner.enumerators import EmbeddingEnumerator
    from torchrec.distributed.planner.shard_estimators import EmbeddingPerfEstimator, EmbeddingStorageEstimator
    from torchrec.distributed.planner.storage_reservations import HeuristicalStorageReservation
    from torchrec.distributed.planner.types import ParameterConstraints
    from torchrec.distributed.types import CacheParams

    from rec.torchrec.score import plan_options

    stated = dict(constraints)
    for module_plan in sharding_plan.plan.values():
        for name, p in module_plan.items():
            if p.cache_params is not None:
                c = stated.get(name, ParameterConstraints())
                stated[name] = replace(c, cache_params=replace(c.cache_params or CacheParams(),
                                                               load_factor=p.cache_params.load_factor))
    enumerator = EmbeddingEnumerator(topology=topology, batch_size=batch, constraints=stated, estimator=[
        EmbeddingPerfEstimator(topology, stated), EmbeddingStorageEstimator(topology, stated)])
    reserved = HeuristicalStorageReservation(percentage=0.15).reserve(topology, batch, model, sharders, stated)
    world = topology.world_size
    perf, hbm, ddr = [0.0] * world, [0] * world, [0] * world
    for option in plan_options(sharding_plan, enumerator.enumerate(model, sharders)):
        for shard in option.shards:
            perf[shard.rank] += shard.perf.total
            hbm[shard.rank] += shard.storage.hbm
            ddr[shard.rank] += shard.storage.ddr
    over = any(h > d.storage.hbm or m > d.storage.ddr for h, m, d in zip(hbm, ddr, reserved.devices, strict=True))
    return max(perf), over


def run(models: int) -> dict[str, Any]:
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder
    from torchrec.distributed.planner import EmbeddingShardingPlanner

    from rec.torchrec import ShardflowPlanner

    sharders: list[Any] = [EmbeddingBagCollectionSharder()]
    rows = []
    for seed in range(FIRST_SEED, FIRST_SEED + models):
        row: dict[str, Any] = {"seed": seed}
        for label, planner in (("shardflow", ShardflowPlanner), ("torchrec", EmbeddingShardingPlanner)):
            model, topology, batch, constraints, mode = model_of(seed)
            row["mode"] = mode
            started = time.perf_counter()
            try:
                plan = planner(topology=topology, batch_size=batch, constraints=constraints).plan(model, sharders)
            except Exception as e:  # either planner may find no plan: recorded, not compared
                row[label] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                continue
            seconds = time.perf_counter() - started
            critical, over = rated(plan, model, topology, batch, constraints, sharders)
            row[label] = {"plan_s": seconds, "critical_path_ms": critical, "over_memory": over}
        if "critical_path_ms" in row["shardflow"] and "critical_path_ms" in row["torchrec"]:
            row["ratio"] = row["shardflow"]["critical_path_ms"] / row["torchrec"]["critical_path_ms"]
        rows.append(row)
        why = row["shardflow"].get("error") or row["torchrec"].get("error")
        shown = f"shardflow/TorchRec {row['ratio']:.4f}" if "ratio" in row else f"not compared: {why}"
        print(f"seed {seed} {mode:16} {shown}", flush=True)
    summary = {}
    for mode in MODES:
        ratios = [r["ratio"] for r in rows if r["mode"] == mode and "ratio" in r]
        if ratios:
            summary[mode] = {"models": len(ratios), "median": statistics.median(ratios), "max": max(ratios),
                             "worse": sum(r > 1 + 1e-6 for r in ratios),
                             "over_memory": sum(r["shardflow"].get("over_memory", False) for r in rows
                                                if r["mode"] == mode and "ratio" in r)}
    return {"first_seed": FIRST_SEED, "models": models, "rows": rows, "summary": summary}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", type=int, default=40)
    parser.add_argument("--out", default=None, help="JSON with every model's ratings")
    args = parser.parse_args()
    warnings.simplefilter("ignore")
    logging.disable(logging.WARNING)
    result = run(args.models)
    print("\nshardflow's plan over TorchRec's, in TorchRec's units (busiest rank), by how factors are given:")
    for mode, s in result["summary"].items():
        print(f"  {mode:16} {s['models']:3d} models: median {s['median']:.3f}x, max {s['max']:.3f}x, "
              f"worse on {s['worse']}, over TorchRec's memory on {s['over_memory']}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
