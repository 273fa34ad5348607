"""Step 3, the plan artifact: validate the merged plan and write plan.json, shards.parquet and
the per-rank chart, atomically."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rec.plan import SHARDS_FILE, Plan, validate_plan, write_plan
from rec.plan.chart import CHART_FILE, rank_load_chart
from rec.plan.io import MOVEMENT_FILE
from rec.settings import knob


@dataclass(frozen=True)
class WriteSettings:
    chart: bool = field(default=True, metadata=knob(
        f"draw {CHART_FILE}: estimated time and memory per rank"))


@dataclass(frozen=True)
class Written:
    plan_path: str  # DIR/plan.json
    files: tuple[str, ...]  # every file written, plan.json first


def write_plan_artifact(plan: Plan, out_dir: str, settings: WriteSettings = WriteSettings()) -> Written:
    """Validate the plan, then write it; a bad plan is a bug here, since the search built it, but
    the check costs little and guards the artifact. (Plans read back, from the cache or for
    training, are also checked against their plan_id: ``check_plan``.)"""
    problems = validate_plan(plan)
    if problems:
        raise AssertionError(f"shardflow built an invalid plan (a bug): {problems.items[:5]}")

    def chart(tmp: Path) -> None:
        rank_load_chart(plan, tmp / CHART_FILE)

    path = write_plan(plan, out_dir, extra=chart if settings.chart else None)
    files = [path, path.parent / SHARDS_FILE] + ([path.parent / CHART_FILE] if settings.chart else [])
    files += [path.parent / MOVEMENT_FILE] if plan.metrics.movement else []
    return Written(str(path), tuple(str(f) for f in files))
