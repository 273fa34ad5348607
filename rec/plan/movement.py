"""How much data a new plan moves compared with the plan it replaces.

A table of the new plan is *kept* (same rows, dim and data type as before), *resized* (other rows,
same dim and data type: its old rows carry over), *re-initialized* (other dim or data type: its
weights cannot carry over), or *added*; old tables not in the new plan are *removed*. Moved bytes
are the parameter and optimizer-state bytes (as the storage estimate counts them) of the kept
and resized tables' old rows that end up on a rank that did not hold them: for every new shard
on rank R, its overlap with the old table minus its overlap with the old shards on R. New data
(added tables, grown rows, re-initialized tables) is not moved data.
"""

from __future__ import annotations

import numpy as np

from rec.config.cost import Optimizer
from rec.cost.tables import optimizer_multiplier, table_optimizer
from rec.plan.metrics import Movement
from rec.plan.types import Plan, Replicas, TablePlan
from rec.spec.types import TableSpec

__all__ = ["Movement", "movement"]


def movement(old: Plan, new: Plan, fresh_critical_path: float | None = None) -> Movement:
    """The movement from ``old`` to ``new`` (plans for the same topology)."""
    world = new.world_size
    old_specs = {t.key: t for t in old.spec.tables}  # tables by name and module
    old_tables = {t.key: t for t in old.tables}
    moved, total = 0, 0
    bytes_in, bytes_out = np.zeros(world, np.int64), np.zeros(world, np.int64)
    counts = {"kept": 0, "resized": 0, "reinitialized": 0, "added": 0, "moved": 0}
    for spec, table in zip(new.spec.tables, new.tables, strict=True):
        per_cell = _bytes_per_cell(spec, table_optimizer(spec, new.planner.cost))
        total += round(per_cell * _cells(table))
        before = old_specs.get(spec.key)
        kind = _kind(before, spec)
        counts[kind] += 1
        if kind not in ("kept", "resized"):
            continue
        assert before is not None
        cells_in, cells_out = _moved_cells(old_tables[spec.key], table, before.num_embeddings,
                                           spec.embedding_dim, world)
        table_moved = round(float(cells_in.sum()) * per_cell)
        moved += table_moved
        counts["moved"] += table_moved > 0
        bytes_in += np.rint(cells_in * per_cell).astype(np.int64)
        bytes_out += np.rint(cells_out * per_cell).astype(np.int64)
    removed = len(set(old_specs) - {t.key for t in new.spec.tables})
    return Movement(moved, total, counts["moved"], counts["kept"], counts["added"], removed,
                    counts["resized"], counts["reinitialized"], fresh_critical_path,
                    tuple(int(x) for x in bytes_in), tuple(int(x) for x in bytes_out))


def _kind(before: TableSpec | None, table: TableSpec) -> str:
    if before is None:
        return "added"
    if before.embedding_dim != table.embedding_dim or before.data_type != table.data_type:
        return "reinitialized"
    return "kept" if before.num_embeddings == table.num_embeddings else "resized"


def _bytes_per_cell(table: TableSpec, optimizer: Optimizer) -> float:
    """Weight plus optimizer-state bytes per weight of the table (``rec.cost.storage``'s rule)."""
    mult = float(optimizer_multiplier(optimizer, np.array([table.embedding_dim]))[0])
    return table.data_type.bytes_per_element * (1.0 + mult)


def _cells(t: TablePlan) -> int:
    """Weights held by all the table's shards together (every replica counts)."""
    if isinstance(t.shards, Replicas):
        r = t.shards.replica
        return r.sizes[0] * r.sizes[1] * t.shards.world_size
    return sum(s.sizes[0] * s.sizes[1] for s in t.shards)


def _boxes(t: TablePlan, world: int) -> tuple[np.ndarray, np.ndarray]:
    """(ranks, boxes [row, col, rows, cols]) of every shard, replicas expanded."""
    if isinstance(t.shards, Replicas):
        r = t.shards.replica
        box = np.array([*r.offsets, *r.sizes], np.int64)
        return np.arange(world), np.tile(box, (world, 1))
    ranks = np.array([s.rank for s in t.shards], np.int64)
    boxes = np.array([(*s.offsets, *s.sizes) for s in t.shards], np.int64).reshape(-1, 4)
    return ranks, boxes


def _overlap(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """(len(a), len(b)) areas of the pairwise intersections of boxes [row, col, rows, cols]."""
    rows = np.minimum(a[:, None, 0] + a[:, None, 2], b[None, :, 0] + b[None, :, 2]) \
        - np.maximum(a[:, None, 0], b[None, :, 0])
    cols = np.minimum(a[:, None, 1] + a[:, None, 3], b[None, :, 1] + b[None, :, 3]) \
        - np.maximum(a[:, None, 1], b[None, :, 1])
    area: np.ndarray = np.maximum(rows, 0) * np.maximum(cols, 0)
    return area


def _moved_cells(old: TablePlan, new: TablePlan, old_rows: int, dim: int,
                 world: int) -> tuple[np.ndarray, np.ndarray]:
    """Per rank, cells of the old table arriving at and leaving it."""
    cells_in, cells_out = np.zeros(world), np.zeros(world)
    if isinstance(old.shards, Replicas):
        return cells_in, cells_out  # every rank already holds the whole old table
    new_ranks, new_boxes = _boxes(new, world)
    old_ranks, old_boxes = _boxes(old, world)
    inside = _overlap(new_boxes, np.array([[0, 0, old_rows, dim]], np.int64))[:, 0]
    pieces = _overlap(new_boxes, old_boxes)  # old shards do not overlap each other
    elsewhere = pieces * (new_ranks[:, None] != old_ranks[None, :])
    arriving = inside - (pieces * (new_ranks[:, None] == old_ranks[None, :])).sum(axis=1)
    np.add.at(cells_in, new_ranks, arriving)
    np.add.at(cells_out, old_ranks, elsewhere.sum(axis=0))
    return cells_in, cells_out
