"""Where shardflow puts things by default: one name for each place."""

from __future__ import annotations

from pathlib import Path

DEFAULT_OUT = "out"  # flows write OUT/plan and OUT/train
PLAN_SUBDIR = "plan"
TRAIN_SUBDIR = "train"
DEFAULT_STATE_DIR = ".shardflow"  # shardflow's own state: the outbox and the plan cache
OUTBOX = "outbox"
PLAN_CACHE = "plan-cache"


def outbox_dir(state_dir: str) -> str:
    return str(Path(state_dir, OUTBOX).resolve())


def plan_cache_dir(state_dir: str) -> str:
    return str(Path(state_dir, PLAN_CACHE).resolve())
