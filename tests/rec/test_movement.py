"""Moved bytes between two plans, checked cell by cell against a brute force."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from rec.plan.movement import movement
from rec.plan.types import Plan, Replicas
from rec.planning import plan_spec
from rec.spec import spec_from_rows
from rec.topology import topology_from_dict

TOPOLOGY = topology_from_dict({"world_size": 4, "local_world_size": 2, "compute_device": "cpu",
                               "ddr_cap": "1GiB", "batch_size": 16})
BASE = [
    {"name": "a", "num_embeddings": 120, "embedding_dim": 8},
    {"name": "b", "num_embeddings": 40, "embedding_dim": 256},
    {"name": "c", "num_embeddings": 7, "embedding_dim": 4},
    {"name": "d", "num_embeddings": 50, "embedding_dim": 16},
]


def owners(plan: Plan, name: str, rows: int, dim: int) -> np.ndarray:
    """(rows, dim, world) bool: which ranks hold each cell."""
    t = plan.table(name)
    held = np.zeros((rows, dim, plan.world_size), bool)
    for s in t.shards:
        (r0, c0), (nr, nc) = s.offsets, s.sizes
        held[r0:r0 + nr, c0:c0 + nc, s.rank] = True
    return held


def brute_force_moved_cells(old: Plan, new: Plan) -> dict[str, int]:
    before = {r["name"]: r for r in old.spec_tables}
    out = {}
    for row in new.spec_tables:
        was = before.get(row["name"])
        if was is None or was["embedding_dim"] != row["embedding_dim"] or was["data_type"] != row["data_type"]:
            continue
        dim, old_rows = row["embedding_dim"], was["num_embeddings"]
        held_before = owners(old, row["name"], old_rows, dim)
        held_after = owners(new, row["name"], row["num_embeddings"], dim)[:old_rows]
        out[row["name"]] = int((held_after[:min(old_rows, row["num_embeddings"])]
                                & ~held_before[:min(old_rows, row["num_embeddings"])]).sum())
    return out


def shuffled(plan: Plan, seed: int) -> Plan:
    """The same plan with the table-wise/column-wise shards on other ranks (still a valid layout)."""
    rng = np.random.default_rng(seed)
    tables = []
    for t in plan.tables:
        if isinstance(t.shards, Replicas) or t.sharding_type.value not in ("table_wise", "column_wise"):
            tables.append(t)
            continue
        shards = tuple(replace(s, rank=int(rng.integers(plan.world_size))) for s in t.shards)
        tables.append(replace(t, shards=shards, ranks=tuple(s.rank for s in shards)))
    return replace(plan, tables=tuple(tables))


@pytest.mark.parametrize("seed", range(4))
def test_moved_bytes_match_a_cell_by_cell_brute_force(seed):
    old = shuffled(plan_spec(spec_from_rows(BASE), TOPOLOGY), seed)
    rows = [dict(r) for r in BASE]
    rows[0]["num_embeddings"] = 240  # grown
    rows[1]["num_embeddings"] = 30  # shrunk
    rows[2]["embedding_dim"] = 8  # re-initialized
    rows.pop(3)  # removed
    rows.append({"name": "e", "num_embeddings": 10, "embedding_dim": 4})  # added
    new = shuffled(plan_spec(spec_from_rows(rows), TOPOLOGY), seed + 10)
    m = movement(old, new)
    cells = brute_force_moved_cells(old, new)
    per_cell = {"a": 4 * (1 + 1 / 8), "b": 4 * (1 + 1 / 256)}
    assert m.moved_bytes == round(sum(cells[n] * per_cell[n] for n in cells))
    assert (m.kept_tables, m.resized_tables, m.reinitialized_tables, m.added_tables, m.removed_tables) \
        == (0, 2, 1, 1, 1)
    assert sum(m.bytes_in) == sum(m.bytes_out) == m.moved_bytes
    assert 0 <= m.moved_fraction <= 1


def test_an_unchanged_plan_moves_nothing_and_a_shuffled_one_moves_what_changed_rank():
    plan = plan_spec(spec_from_rows(BASE), TOPOLOGY)
    assert movement(plan, plan).moved_bytes == 0
    assert movement(plan, plan).kept_tables == len(BASE)
    other = shuffled(plan, 3)
    cells = brute_force_moved_cells(plan, other)
    assert movement(plan, other).moved_tables == sum(v > 0 for v in cells.values())
