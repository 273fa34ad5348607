"""The progress steps (``rec.progress``) of ingest, search and write, for the Prefect tasks and the
CLI alike: one home for what each step is called and says. (Training reports its own: ``tasks.train``.)"""

from __future__ import annotations

from contextlib import AbstractContextManager
from pathlib import Path

from rec import progress
from tasks.ingest import Inputs
from tasks.search import SearchSettings


def ingesting(spec_path: str) -> AbstractContextManager[progress.Ending]:
    return progress.step("ingest", f"reading {Path(spec_path).name}")


def searching(inputs: Inputs, settings: SearchSettings) -> AbstractContextManager[progress.Ending]:
    return progress.step("search", f"{len(inputs.spec):,} tables on {inputs.topology.world_size:,} ranks "
                                   f"({settings.backend.value})")


def writing(out_dir: str) -> AbstractContextManager[progress.Ending]:
    return progress.step("write", f"plan.json, shards.parquet and the chart to {out_dir}")
