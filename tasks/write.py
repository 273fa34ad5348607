"""Step 3, the plan artifact: validate the merged plan and write plan.json, shards.parquet and
the per-rank chart, atomically and as a unit (an earlier plan's files that this one does not have
are removed: ``rec.plan.io.write_plan_files``)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rec.plan import Plan, validate_plan
from rec.plan.chart import CHART_FILE, rank_load_chart
from rec.plan.io import write_plan_files
from rec.settings import knob
from tasks.plan_cache import CACHE_DIGEST_FILE


@dataclass(frozen=True)
class WriteSettings:
    chart: bool = field(default=True, metadata=knob(
        f"draw {CHART_FILE}: estimated time and memory per rank"))


@dataclass(frozen=True)
class Written:
    plan_path: str  # DIR/plan.json
    files: tuple[str, ...]  # every file of this plan, plan.json first (no earlier plan's: they are removed)


def write_plan_artifact(plan: Plan, out_dir: str, settings: WriteSettings = WriteSettings()) -> Written:
    """Validate the plan, then write it; a bad plan is a bug here, since the search built it, but
    the check costs little and guards the artifact. (Plans read back, from the cache or for
    training, are also checked against their plan_id and their metrics recomputed: ``check_plan``.)"""
    problems = validate_plan(plan)
    if problems:
        raise AssertionError(f"shardflow built an invalid plan (a bug): {problems.items[:5]}")

    def chart(tmp: Path) -> None:
        rank_load_chart(plan, tmp / CHART_FILE)

    # A directory that was a plan cache entry loses its digest: it no longer describes the files.
    files = write_plan_files(plan, out_dir, extra=chart if settings.chart else None, owned=(CACHE_DIGEST_FILE,))
    return Written(str(files[0]), tuple(str(f) for f in files))
