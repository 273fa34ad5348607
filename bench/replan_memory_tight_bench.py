"""Replanning where memory decides: a replan with ``--previous`` against planning the changed spec
afresh, side by side in one run, on ``memory_tight_bench``'s workloads.

Each workload (tables 2-10x the ranks' HBM, TorchRec cache statistics on its tables) is planned
by ``ShardflowPlanner`` as a drop-in user plans it; then its three smallest tables' rows grow 1.5x
(a schema change that keeps every table) and the changed spec is planned twice: from scratch
(``plan_spec``, what ``shardflow plan`` without ``--previous`` gives) and replanned from the first
plan (``replan_spec``, default ``--max-regress`` 0.02). Printed per workload: the critical paths
(ms, shardflow's model: TorchRec's default profile), the replan's over the plan afresh, the share of
the first plan's bytes each moves (``rec.plan.movement``), and the seconds each took. The target:
the replan within ``1 + max_regress`` of the plan afresh, moving no more than it.

    .venv/bin/python bench/replan_memory_tight_bench.py [--seeds 3016 3017 ...] \\
        [--out bench/results/replan_memory_tight_bench.json]

Seeds 3000-3099 take ``memory_tight_bench``'s first set of generators, 3200-3299 its second
(``--other-shapes``), 3300-3399 its third, 3400-3499 its fourth (a third of the tables without
statistics), 3500-3599 its fifth (ranks that are not a power of two, tables barely over the HBM);
the default is four of each of the first three sets that no change to the replan was chosen on.
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import sys
import time
import warnings
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import memory_tight_bench as tight  # noqa: E402
from rec.plan.movement import movement  # noqa: E402
from rec.planning import plan_spec, replan_spec  # noqa: E402
from rec.spec import spec_from_rows  # noqa: E402
from rec.spec.columns import table_to_row  # noqa: E402

MAX_REGRESS = 0.02
GROWN_TABLES, GROWTH = 3, 1.5
SEEDS = (3020, 3021, 3022, 3023, 3240, 3241, 3242, 3243, 3340, 3341, 3342, 3343)
# Which of memory_tight_bench's sets of generators a seed takes.
FIRST_SEEDS, OTHER_SEEDS = range(3000, 3100), range(3200, 3300)


def workload(seed: int) -> tight.Workload:
    return tight.workload(seed, other=seed in OTHER_SEEDS, third=seed in tight.THIRD_SEEDS,
                          fourth=seed in tight.FOURTH_SEEDS, fifth=seed in tight.FIFTH_SEEDS)


@dataclass(frozen=True)
class Row:
    workload: str
    tables: int
    ranks: int
    first_ms: float  # the first plan's critical path, on the spec before the change
    afresh_ms: float
    replan_ms: float
    replan_over_afresh: float
    replan_moved: float  # the share of the first plan's bytes that move
    afresh_moved: float
    first_s: float
    afresh_s: float
    replan_s: float


def bench(seed: int) -> Row:
    from torchrec.distributed.embedding import EmbeddingCollectionSharder
    from torchrec.distributed.embeddingbag import EmbeddingBagCollectionSharder

    from rec.spec.torchrec_modules import spec_model
    from rec.torchrec import ShardflowPlanner

    w = workload(seed)
    planner = ShardflowPlanner(topology=tight.torchrec_topology(w), batch_size=w.batch_size,
                               constraints=tight.constraints_of(w, True))
    sharders = [EmbeddingBagCollectionSharder(), EmbeddingCollectionSharder()]
    tight._quiet(planner.plan, spec_model(tight.spec_of(w)), sharders)
    first = planner.last_plan
    assert first is not None and first.planner.search is not None
    cost, config = first.planner.cost, first.planner.search
    tables = first.spec.tables
    rows = [table_to_row(t) for t in tables]
    for i in sorted(range(len(rows)), key=lambda i: tables[i].num_embeddings)[:GROWN_TABLES]:
        rows[i] = {**rows[i], "num_embeddings": int(tables[i].num_embeddings * GROWTH)}
    spec = spec_from_rows(rows)
    started = time.perf_counter()
    afresh = plan_spec(spec, first.topology, cost, config)
    afresh_s = time.perf_counter() - started
    started = time.perf_counter()
    replanned = replan_spec(spec, first.topology, first, MAX_REGRESS, cost, config)
    replan_s = time.perf_counter() - started
    cp, fresh_cp = replanned.plan.metrics.critical_path, afresh.metrics.critical_path
    return Row(w.name, len(rows), w.world_size, first.metrics.critical_path, fresh_cp, cp, cp / fresh_cp,
               replanned.movement.moved_fraction, movement(first, afresh).moved_fraction,
               planner.last_search_s, afresh_s, replan_s)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=list(SEEDS))
    p.add_argument("--out", type=Path, default=Path(__file__).parent / "results" / "replan_memory_tight_bench.json")
    args = p.parse_args(argv)
    for seed in args.seeds:
        if not any(seed in seeds for seeds in (FIRST_SEEDS, OTHER_SEEDS, tight.THIRD_SEEDS, tight.FOURTH_SEEDS,
                                               tight.FIFTH_SEEDS)):
            p.error(f"seed {seed}: take 3000-3099, 3200-3299, 3300-3399, 3400-3499 or 3500-3599 "
                    "(memory_tight_bench's sets)")
    logging.disable(logging.WARNING)
    warnings.simplefilter("ignore")
    print(f"{'workload':>22} {'tables':>6} {'first':>9} {'afresh':>9} {'replan':>9} {'ratio':>7} {'moved':>7} "
          f"{'afresh moved':>12}   s: first, afresh, replan")
    rows = []
    for seed in args.seeds:
        r = bench(seed)
        rows.append(r)
        print(f"{r.workload:>22} {r.tables:>6} {r.first_ms:>9.4g} {r.afresh_ms:>9.4g} {r.replan_ms:>9.4g} "
              f"{r.replan_over_afresh:>7.4f} {r.replan_moved:>7.1%} {r.afresh_moved:>12.1%}   "
              f"{r.first_s:.1f}, {r.afresh_s:.1f}, {r.replan_s:.1f}", flush=True)
    ratios = [r.replan_over_afresh for r in rows]
    within = sum(x <= (1 + MAX_REGRESS) * (1 + 1e-9) for x in ratios)
    no_more = sum(r.replan_moved <= r.afresh_moved for r in rows)
    print(f"replan / afresh: median {statistics.median(ratios):.4f}, max {max(ratios):.4f}; within {1 + MAX_REGRESS} "
          f"on {within} of {len(rows)}; moved no more than afresh on {no_more}; moved median "
          f"{statistics.median(r.replan_moved for r in rows):.1%} (afresh "
          f"{statistics.median(r.afresh_moved for r in rows):.1%})")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps([asdict(r) for r in rows], indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
