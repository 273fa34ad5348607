"""``shardflow compare``: plans and their training runs side by side, from MLflow.

One row per training of a plan (plans never trained get one row with ``-``), newest plans first:
the plan's quality in TorchRec's cost model next to the latency measured when training with it.
A training that failed shows FAILED, with its cause under the table.
"""

from __future__ import annotations

import argparse
from datetime import datetime

from rec.settings import add_flags

HEADER = ("plan_id", "spec_hash", "tables", "world", "backend", "critical_path", "lower_bound",
          "gap", "previous", "moved", "trained", "p50_ms", "p90_ms", "samples_s")
NUMBERS = ("tables", "world", "critical_path", "lower_bound", "gap", "moved", "p50_ms", "p90_ms", "samples_s")


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("compare", help="plans and training runs side by side (from MLflow)",
                              description=__doc__)
    p.add_argument("--spec-hash", default=None, help="only plans of this spec hash")
    p.add_argument("--plan-id", default=None, help="only this plan")
    p.add_argument("--last", type=int, default=20, metavar="N", help="the N newest plans (default 20)")
    from tasks.tracking import TrackingSettings

    add_flags(p, TrackingSettings, skip=("track",))
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from flows.text_table import render_table
    from rec.errors import InputError, Problem
    from rec.settings import from_flags
    from tasks.outbox import Outbox
    from tasks.records import ERROR
    from tasks.tracking import TrackingSettings, TrackingUnavailable, connect, find_runs

    if args.last < 1:
        raise InputError("Cannot compare:", [Problem("--last", f"must be at least 1, got {args.last}")])
    tracking = from_flags(TrackingSettings, args).resolve()
    try:
        client, experiment_id = connect(tracking)
    except TrackingUnavailable as e:
        raise InputError("Cannot read MLflow:", [Problem(tracking.uri, str(e))]) from None
    filters = {k: v for k, v in (("spec_hash", args.spec_hash), ("plan_id", args.plan_id)) if v}
    plans = find_runs(client, [experiment_id], step="plan", finished=True, max_results=args.last,
                      **filters)
    rows, failed = [], []
    for plan in plans:
        plan_id = plan.data.tags["shardflow.plan_id"]
        trains = [t for t in find_runs(client, [experiment_id], step="train", plan_id=plan_id)
                  if t.info.status in ("FINISHED", "FAILED")]
        rows += [plan_row(plan, train) for train in trains] or [plan_row(plan, None)]
        failed += [t for t in trains if t.info.status == "FAILED"]
    if rows:
        print(render_table(HEADER, rows, right=NUMBERS))
        for t in failed:
            print(f"\nFAILED training of plan {t.data.tags['shardflow.plan_id']} on {_started(t)}: "
                  f"{t.data.tags.get(ERROR, 'no cause recorded')}")
    else:
        print(f"no plan runs in experiment {tracking.experiment!r} at {tracking.uri}"
              + (" matching the filters" if filters else ""))
    waiting = len(Outbox(tracking.outbox_dir).entries())
    if waiting:
        print(f"\n{waiting} record(s) wait in {tracking.outbox_dir} for MLflow (not shown)")
    return 0


def plan_row(plan, train) -> tuple:
    """Plan columns, then the training's (``-`` without one)."""
    p, params = plan.data.metrics, plan.data.params
    row = (plan.data.tags["shardflow.plan_id"], plan.data.tags.get("shardflow.spec_hash", "-"),
           params.get("tables", "-"), params.get("world_size", "-"), params.get("backend", "-"),
           f"{p['critical_path']:.4f}", f"{p['lower_bound']:.4f}", f"{100 * p.get('gap', 0):.2f}%",
           plan.data.tags.get("shardflow.previous_plan_id", "-"),
           f"{100 * p['moved_fraction']:.2f}%" if "moved_fraction" in p else "-")
    if train is None:
        return row + ("-",) * 4
    if train.info.status == "FAILED":
        return (*row, _started(train), "FAILED", "-", "-")
    t = train.data.metrics
    return (*row, _started(train), f"{t['iteration_latency_ms_p50']:.2f}", f"{t['iteration_latency_ms_p90']:.2f}",
            f"{t['samples_per_s']:,.0f}")


def _started(run) -> str:
    return datetime.fromtimestamp(run.info.start_time / 1000).strftime("%Y-%m-%d %H:%M")
