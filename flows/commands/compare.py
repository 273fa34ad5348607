"""``shardflow compare``: plans and the runs that trained or measured them, side by side, from MLflow.

One row per training or measurement of a plan (a plan with neither gets one row with ``-``),
plans with the newest runs first: every train and measure run appears, whoever made its plan
(``shardflow plan``, ``run``, the drop-in ``ShardflowPlanner``, TorchRec's own planner) and whether
or not MLflow has a plan run of it, since each run carries its plan's params and metrics. What
the plan was made for and by (``planner``: shardflow, torchrec, torchrec-dp; spec, topology,
profile), its predicted iteration time (``pred_ms``, as ``plan`` prints it; ``gap``: how far its
critical path is above its proven lower bound, ``opt`` when proven optimal), and next to it the
run (``train`` or ``measure``): batch size per rank, iterations, the iteration time measured
(``p50_ms``, ``p90_ms``), ``p50/pred`` (measured over predicted, when run at the batch size the plan
predicts for), samples/s, and the model's quality on held-out data where the training evaluated it
(``auc``, ``ne``: its last evaluation). The table fits the terminal's width, the most telling columns first
and names cut short if need be; ``--wide`` shows every column in full (spec hash, backend, lower
bound, the plan replanned from and the share of bytes moved, the run's start). A training that
failed shows FAILED, with its cause under the table.
"""

from __future__ import annotations

import argparse
import math
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING

from rec.exit_codes import ExitCode
from rec.settings import add_flags

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run

    from tasks.outbox import Outbox
    from tasks.tracking import Tracking

Row = tuple[str, ...]  # one row of the table, in HEADER's order
HEADER = ("plan_id", "planner", "spec", "topology", "profile", "tables", "world", "pred_ms", "lower_ms", "gap",
          "spec_hash", "backend", "previous", "moved", "run", "started", "batch", "iters", "p50_ms", "p90_ms",
          "p50/pred", "samples_s", "auc", "ne")
NUMBERS = ("tables", "world", "pred_ms", "lower_ms", "gap", "moved", "batch", "iters", "p50_ms", "p90_ms",
           "p50/pred", "samples_s", "auc", "ne")
# What a narrow terminal shows, most telling first: predicted against measured, who planned, which
# run, then what explains them.
PRIORITY = ("plan_id", "pred_ms", "p50_ms", "planner", "run", "spec", "topology", "gap", "batch", "iters",
            "profile", "p50/pred", "samples_s", "auc", "ne", "world", "tables", "p90_ms", "started", "moved",
            "previous", "lower_ms", "backend", "spec_hash")
# Without --wide: what must fit, and how short names (spec, topology, profile) may be cut to fit it.
ESSENTIAL = PRIORITY[:7]
NAMES = ("spec", "topology", "profile")
NAME_WIDTHS = (20, 16, 12, 10, 8)
SCAN = 1000  # runs of each kind read to find the plans with the newest runs
# Each value under today's name, then the names earlier versions logged it under (docs/mlflow.md).
PREDICTED_NAMES = ("predicted_iteration_ms", "predicted_critical_path_ms", "critical_path_predicted_ms",
                   "critical_path_ms", "critical_path")
MEASURED_NAMES = ("measured_iteration_ms", "iteration_latency_ms_p50", "critical_path_measured_ms")
P90_NAMES = ("measured_iteration_p90_ms", "iteration_latency_ms_p90", "measured_p90_ms")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("compare", help="plans, their trainings and measurements side by side (from MLflow)",
                              description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--spec-hash", default=None, help="only plans of this spec hash")
    p.add_argument("--plan-id", default=None, help="only this plan")
    p.add_argument("--last", type=int, default=20, metavar="N", help="the N newest plans (default 20)")
    p.add_argument("--wide", action="store_true", help="every column, however wide the terminal")
    from tasks.tracking import TrackingSettings

    add_flags(p, TrackingSettings, skip=("track",))
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    from rec.errors import InputError, Problem, show
    from rec.hashing import HASH_CHARS
    from rec.settings import from_flags
    from tasks.outbox import Outbox, retry_command
    from tasks.plan_fetch import PLAN_ID, plan_id_problems
    from tasks.records import ERROR
    from tasks.tracking import TrackingSettings, TrackingUnavailable, tracking_failure
    from tasks.tracking.store import open_read_only

    problems = [] if args.last >= 1 else [Problem("--last", f"must be at least 1, got {args.last}")]
    # a prefix or a typo matched nothing and said only that no run matched, exit 0
    if args.plan_id is not None:
        problems += plan_id_problems(args.plan_id, "--plan-id")
    if args.spec_hash is not None and not PLAN_ID.fullmatch(args.spec_hash):
        problems.append(Problem(f"--spec-hash {show(args.spec_hash)}",
                                f"is not a spec hash ({HASH_CHARS} hex digits, as `shardflow spec validate` says)"))
    if problems:
        raise InputError("Cannot compare:", problems)
    tracking = from_flags(TrackingSettings, args).resolve()
    filters = {k: v for k, v in (("spec_hash", args.spec_hash), ("plan_id", args.plan_id)) if v}
    try:  # read only: never creates, migrates or writes the store
        client, experiment_id = open_read_only(tracking)
        rows, failed = read_rows(client, experiment_id, args.last, filters) if experiment_id else ([], [])
    except TrackingUnavailable as e:
        raise InputError(f"Cannot read MLflow at {tracking.uri}: {e}") from None
    except Exception as e:
        why = tracking_failure(e)
        if why is None:
            raise
        raise InputError(f"Cannot read MLflow at {tracking.uri}: {why}") from None
    if experiment_id is None:
        print(f"no experiment {tracking.experiment!r} at {tracking.uri} yet: no runs")
    elif rows:
        print(render_rows(rows, None if args.wide else _terminal_width()))
        for t in failed:
            print(f"\nFAILED training of plan {t.data.tags['shardflow.plan_id']} on {_started(t)}: "
                  f"{t.data.tags.get(ERROR, 'no cause recorded')}")
    else:
        print(f"no plan, train or measure runs in experiment {tracking.experiment!r} at {tracking.uri}"
              + (" matching the filters" if filters else ""))
    here, elsewhere, untrusted = _waiting(Outbox(tracking.outbox_dir), tracking)
    listing = retry_command(tracking.outbox_dir, verb="list")
    if here:
        print(f"\n{here} record(s) wait in {tracking.outbox_dir} for MLflow, not shown (plans of `shardflow "
              f"plan` wait there for the next command that records): `{retry_command(tracking.outbox_dir)}` "
              "delivers them")
    if elsewhere:
        print(f"\n{elsewhere} record(s) wait in {tracking.outbox_dir} for another store or experiment: "
              f"`{listing}` names them")
    if untrusted:
        print(f"\n{untrusted} record(s) in {tracking.outbox_dir} cannot be trusted (the next delivery sets them "
              f"aside): `{listing}` says why")
    return ExitCode.OK


def _waiting(outbox: Outbox, tracking: Tracking) -> tuple[int, int, int]:
    """The records waiting in the outbox that this store's experiment will show once delivered (theirs,
    and those that go wherever the next delivery goes), those for another store or experiment, and
    those that cannot be trusted (the next delivery sets them aside)."""
    counts = [0, 0, 0]
    for entry in outbox.describe():
        if entry.set_aside:
            continue
        to = entry.destination
        ours = to is None or (to.uri, to.experiment) == (tracking.uri, tracking.experiment)
        counts[2 if entry.problem is not None else 0 if ours else 1] += 1
    return counts[0], counts[1], counts[2]


def _terminal_width() -> int:
    import shutil

    return shutil.get_terminal_size().columns


def render_rows(rows: list[Row], width: int | None) -> str:
    """The table in ``width`` characters (None: every column), and a line naming what it left out."""
    from rec.text_table import fit_columns, render_table, select

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


def read_rows(client: MlflowClient, experiment_id: str, last: int,
              filters: dict[str, str]) -> tuple[list[Row], list[Run]]:
    """The table's rows, and the FAILED train runs among them."""
    from tasks.records import PLAN_ID, STEP, RunStatus, RunStep
    from tasks.tracking import find_runs

    shown = (RunStatus.FINISHED, RunStatus.FAILED)
    newest: dict[str, int] = {}  # plan_id: the start of its newest run
    for step in (RunStep.PLAN, RunStep.TRAIN, RunStep.MEASURE):
        for run in find_runs(client, [experiment_id], step=step, finished=False, max_results=SCAN, **filters):
            plan_id = run.data.tags.get(PLAN_ID)
            if plan_id and run.info.status in shown:
                newest[plan_id] = max(newest.get(plan_id, 0), run.info.start_time)
    rows, failed = [], []
    for plan_id in sorted(newest, key=lambda p: newest[p], reverse=True)[:last]:
        runs = [r for r in find_runs(client, [experiment_id], plan_id=plan_id) if r.info.status in shown]
        plans = [r for r in runs if r.data.tags.get(STEP) == RunStep.PLAN and r.info.status == RunStatus.FINISHED]
        done = [r for r in runs if r.data.tags.get(STEP) in (RunStep.TRAIN, RunStep.MEASURE)]
        # The plan's columns from its plan run, else from a run that carries the plan's params (else,
        # logged before runs did, from whatever a finished run has).
        finished = [r for r in done if r.info.status == RunStatus.FINISHED]
        carrying = [r for r in finished + done if "spec.hash" in r.data.params]  # a FAILED one last
        source = next(iter(plans), None) or next(iter(carrying), next(iter(finished), None))
        rows += [plan_row(source, run, plan_id) for run in done] or [plan_row(source, None, plan_id)]
        failed += [r for r in done if r.info.status == RunStatus.FAILED]
    return rows, failed


def plan_row(source: Run | None, run: Run | None, plan_id: str) -> Row:
    """One row: the plan's columns (from ``source``, a run carrying the plan's params and metrics)
    and the train or measure run's (``-`` without one), in HEADER's order."""
    from rec.plan.metrics import shown_gap
    from tasks.records import PREVIOUS_PLAN_ID, SPEC_HASH, SPEC_PATH, STEP, TOPOLOGY_PATH, RunStep

    p = source.data.metrics if source else {}
    params = source.data.params if source else {}
    tags = source.data.tags if source else {}
    predicted = _first(p, PREDICTED_NAMES)
    gap = p.get("gap_pct", 100 * p["gap"] if "gap" in p else None)
    # Plan runs from before the `planner` param were all shardflow's search.
    planner = params.get("planner") or ("shardflow" if tags.get(STEP) == RunStep.PLAN else "-")
    moved = p.get("moved_pct", 100 * p["moved_fraction"] if "moved_fraction" in p else None)
    row = {
        "plan_id": plan_id, "planner": planner,
        # the run's own spec where it names one: plans of one content from two files share a plan_id
        "spec": (run.data.params.get("spec.name") if run else None) or params.get("spec.name")
        or _stem(tags.get(SPEC_PATH)) or "-",
        "topology": params.get("topology.name") or _stem(tags.get(TOPOLOGY_PATH)) or "-",
        "profile": params.get("profile.name", "-"),
        "tables": params.get("tables", "-"), "world": params.get("topology.world_size", params.get("world_size", "-")),
        "pred_ms": _significant(predicted), "lower_ms": _significant(_first(p, ("lower_bound_ms", "lower_bound"))),
        "gap": "opt" if p.get("optimal") else f"{_significant(shown_gap(gap), 3)}%" if gap is not None else "-",
        "spec_hash": tags.get(SPEC_HASH, "-"), "backend": params.get("backend", "-"),
        "previous": tags.get(PREVIOUS_PLAN_ID, "-"),
        "moved": f"{_significant(moved, 3)}%" if moved is not None else "-",
    }
    row.update(_run_columns(run, predicted, params.get("topology.batch_size")))
    return tuple(row.get(name, "-") for name in HEADER)


def _run_columns(run: Run | None, predicted: float | None, plan_batch: str | None) -> dict[str, str]:
    from tasks.records import RATIO, STEP, RunStatus

    if run is None:
        return {}
    params = run.data.params
    row = {"run": run.data.tags.get(STEP, "-"), "started": _started(run), "batch": params.get("batch_size", "-"),
           "iters": params.get("iterations", "-")}
    if run.info.status == RunStatus.FAILED:
        return {**row, "p50_ms": "FAILED"}
    t = run.data.metrics
    p50, p90 = _first(t, MEASURED_NAMES), _first(t, P90_NAMES)
    ratio = t.get(RATIO)
    if ratio is None and p50 is not None and predicted and plan_batch == params.get("batch_size"):
        ratio = p50 / predicted  # runs logged before the ratio was
    return {**row, "p50_ms": _fixed(p50), "p90_ms": _fixed(p90),
            "p50/pred": f"{_significant(ratio, 3)}x" if ratio is not None else "-",
            "samples_s": f"{t['samples_per_s']:,.0f}" if "samples_per_s" in t else "-",
            "auc": _fixed(t.get("eval_auc"), 4), "ne": _fixed(t.get("eval_ne"), 4)}


def _first(metrics: dict[str, float], names: tuple[str, ...]) -> float | None:
    """The value under the first of ``names`` the run has."""
    return next((metrics[n] for n in names if n in metrics), None)


def _fixed(value: float | None, decimals: int = 2) -> str:
    return "-" if value is None else f"{value:.{decimals}f}"


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


def _started(run: Run) -> str:
    return datetime.fromtimestamp(run.info.start_time / 1000).strftime("%Y-%m-%d %H:%M")
