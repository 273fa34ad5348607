"""``shardflow compare``: plans and their training runs side by side, from MLflow.

One row per training of a plan (plans never trained get one row with ``-``), newest plans first:
what the plan was made for (spec, topology, profile), its predicted critical path in TorchRec's
cost model (``pred_ms``; ``gap``: how far above its proven lower bound, ``opt`` when proven
optimal), and next to it the training: batch size per rank, iterations, the latency measured
(``p50_ms``, ``p90_ms``), ``p50/pred`` (measured over predicted, when trained at the batch size
the plan was made for) and samples/s. The table fits the terminal's width, the most telling columns
first and names cut short if need be; ``--wide`` shows every column in full (spec hash, backend,
lower bound, the plan replanned from and the share of bytes moved, the training's start). A
training that failed shows FAILED, with its cause under the table.
"""

from __future__ import annotations

import argparse
import math
from datetime import datetime
from pathlib import Path

from rec.exit_codes import ExitCode
from rec.settings import add_flags

HEADER = ("plan_id", "spec", "topology", "profile", "tables", "world", "pred_ms", "lower_ms", "gap",
          "spec_hash", "backend", "previous", "moved", "trained", "batch", "iters", "p50_ms", "p90_ms",
          "p50/pred", "samples_s")
NUMBERS = ("tables", "world", "pred_ms", "lower_ms", "gap", "moved", "batch", "iters", "p50_ms", "p90_ms",
           "p50/pred", "samples_s")
# What a narrow terminal shows, most telling first: predicted against measured, then what explains them.
PRIORITY = ("plan_id", "pred_ms", "p50_ms", "gap", "spec", "topology", "batch", "iters", "profile",
            "p50/pred", "samples_s", "world", "tables", "p90_ms", "trained", "moved", "previous", "lower_ms",
            "backend", "spec_hash")
# Without --wide: what must fit, and how short names (spec, topology, profile) may be cut to fit it.
ESSENTIAL = PRIORITY[:8]
NAMES = ("spec", "topology", "profile")
NAME_WIDTHS = (20, 16, 12, 10, 8)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser("compare", help="plans and training runs side by side (from MLflow)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec-hash", default=None, help="only plans of this spec hash")
    p.add_argument("--plan-id", default=None, help="only this plan")
    p.add_argument("--last", type=int, default=20, metavar="N", help="the N newest plans (default 20)")
    p.add_argument("--wide", action="store_true", help="every column, however wide the terminal")
    from tasks.tracking import TrackingSettings

    add_flags(p, TrackingSettings, skip=("track",))
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from rec.errors import InputError, Problem
    from rec.settings import from_flags
    from tasks.outbox import Outbox
    from tasks.records import ERROR
    from tasks.tracking import TrackingSettings, TrackingUnavailable, connect, tracking_failure

    if args.last < 1:
        raise InputError("Cannot compare:", [Problem("--last", f"must be at least 1, got {args.last}")])
    tracking = from_flags(TrackingSettings, args).resolve()
    filters = {k: v for k, v in (("spec_hash", args.spec_hash), ("plan_id", args.plan_id)) if v}
    try:
        client, experiment_id = connect(tracking)
        rows, failed = read_rows(client, experiment_id, args.last, filters)
    except TrackingUnavailable as e:
        raise InputError("Cannot read MLflow:", [Problem(tracking.uri, str(e))]) from None
    except Exception as e:
        why = tracking_failure(e)
        if why is None:
            raise
        raise InputError("Cannot read MLflow:", [Problem(tracking.uri, why)]) from None
    if rows:
        print(render_rows(rows, None if args.wide else _terminal_width()))
        for t in failed:
            print(f"\nFAILED training of plan {t.data.tags['shardflow.plan_id']} on {_started(t)}: "
                  f"{t.data.tags.get(ERROR, 'no cause recorded')}")
    else:
        print(f"no plan runs in experiment {tracking.experiment!r} at {tracking.uri}"
              + (" matching the filters" if filters else ""))
    waiting = len(Outbox(tracking.outbox_dir).entries())
    if waiting:
        print(f"\n{waiting} record(s) wait in {tracking.outbox_dir} for MLflow (not shown)")
    return ExitCode.OK


def _terminal_width() -> int:
    import shutil

    return shutil.get_terminal_size().columns


def render_rows(rows: list[tuple], width: int | None) -> str:
    """The table in ``width`` characters (None: every column), and a line naming what it left out."""
    from flows.text_table import fit_columns, render_table, select

    if width is None:
        return render_table(HEADER, rows, right=NUMBERS)
    for name_width in NAME_WIDTHS:
        cut = [tuple(_cut(cell, name_width) if name in NAMES else cell for name, cell in zip(HEADER, row, strict=True))
               for row in rows]
        columns = fit_columns(HEADER, cut, PRIORITY, width)
        if set(ESSENTIAL) <= set(columns):
            break
    header, shown = select(HEADER, cut, columns)
    hidden = len(HEADER) - len(columns)
    note = f"\n({hidden} more column{'s' if hidden > 1 else ''} with --wide)" if hidden else ""
    return render_table(header, shown, right=NUMBERS) + note


def read_rows(client, experiment_id: str, last: int, filters: dict[str, str]) -> tuple[list, list]:
    """The table's rows, and the FAILED train runs among them."""
    from tasks.records import PLAN_ID, RunStatus, RunStep
    from tasks.tracking import find_runs

    plans = find_runs(client, [experiment_id], step=RunStep.PLAN, finished=True, max_results=last, **filters)
    rows, failed = [], []
    for plan in plans:
        plan_id = plan.data.tags[PLAN_ID]
        trains = [t for t in find_runs(client, [experiment_id], step=RunStep.TRAIN, plan_id=plan_id)
                  if t.info.status in (RunStatus.FINISHED, RunStatus.FAILED)]
        rows += [plan_row(plan, train) for train in trains] or [plan_row(plan, None)]
        failed += [t for t in trains if t.info.status == RunStatus.FAILED]
    return rows, failed


def plan_row(plan, train) -> tuple:
    """One row: the plan's columns and the training's (``-`` without one), in HEADER's order."""
    from tasks.records import PLAN_ID, PREVIOUS_PLAN_ID, SPEC_HASH, SPEC_PATH, TOPOLOGY_PATH

    p, params, tags = plan.data.metrics, plan.data.params, plan.data.tags
    predicted = p.get("predicted_critical_path_ms", p.get("critical_path_ms", p.get("critical_path")))
    gap = p.get("gap_pct", 100 * p.get("gap", 0.0))
    row = {
        "plan_id": tags[PLAN_ID],
        "spec": params.get("spec.name") or _stem(tags.get(SPEC_PATH)) or "-",
        "topology": params.get("topology.name") or _stem(tags.get(TOPOLOGY_PATH)) or "-",
        "profile": params.get("profile.name", "-"),
        "tables": params.get("tables", "-"), "world": params.get("world_size", "-"),
        "pred_ms": _significant(predicted), "lower_ms": _significant(p.get("lower_bound_ms", p.get("lower_bound"))),
        "gap": "opt" if p.get("optimal") else f"{_significant(gap, 3)}%",
        "spec_hash": tags.get(SPEC_HASH, "-"), "backend": params.get("backend", "-"),
        "previous": tags.get(PREVIOUS_PLAN_ID, "-"),
        "moved": f"{_significant(p.get('moved_pct', 100 * p.get('moved_fraction', 0.0)), 3)}%"
                 if "moved_fraction" in p else "-",
    }
    row.update(_train_columns(train, predicted, params.get("topology.batch_size")))
    return tuple(row.get(name, "-") for name in HEADER)


def _train_columns(train, predicted: float | None, plan_batch: str | None) -> dict[str, str]:
    if train is None:
        return {}
    params = train.data.params
    row = {"trained": _started(train), "batch": params.get("batch_size", "-"), "iters": params.get("iterations", "-")}
    from tasks.records import RunStatus

    if train.info.status == RunStatus.FAILED:
        return {**row, "p50_ms": "FAILED"}
    t = train.data.metrics
    p50 = t["iteration_latency_ms_p50"]
    same_batch = plan_batch is not None and plan_batch == params.get("batch_size")
    return {**row, "p50_ms": f"{p50:.2f}", "p90_ms": f"{t['iteration_latency_ms_p90']:.2f}",
            "p50/pred": f"{_significant(p50 / predicted, 3)}x" if same_batch and predicted else "-",
            "samples_s": f"{t['samples_per_s']:,.0f}"}


def _significant(value: float | None, digits: int = 4) -> str:
    """``value`` with ``digits`` significant digits and no exponent: differences stay visible."""
    if value is None:
        return "-"
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{decimals}f}"


def _cut(name: str, width: int) -> str:
    return name if len(name) <= width else name[: width - 1] + "…"


def _stem(path: str | None) -> str | None:
    return Path(path).stem if path else None


def _started(run) -> str:
    return datetime.fromtimestamp(run.info.start_time / 1000).strftime("%Y-%m-%d %H:%M")
