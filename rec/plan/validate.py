"""Check a plan before anyone trusts it: every table once, shards tile each table, ranks and
hosts as the sharding type requires, memory within capacity, allow-lists honoured."""

from __future__ import annotations

from rec.errors import ProblemList
from rec.plan.identity import identity_problems
from rec.plan.types import Plan, Replicas, TablePlan
from rec.sharding import ComputeDevice, ShardingType, is_available


def validate_plan(plan: Plan) -> ProblemList:
    """Every problem found; empty when the plan is sound."""
    problems = ProblemList()
    topo = plan.topology
    world, local = int(topo["world_size"]), int(topo["local_world_size"])
    device = ComputeDevice(topo["compute_device"])
    spec = {row["name"]: row for row in plan.spec_tables}
    seen: set[str] = set()
    for t in plan.tables:
        where = f"table {t.name}"
        if t.name in seen:
            problems.add(where, "planned more than once")
        seen.add(t.name)
        row = spec.get(t.name)
        if row is None:
            problems.add(where, "is not in the spec")
            continue
        _check_kind(t, row, device, problems)
        _check_shards(t, row, world, local, problems)
    for name in spec.keys() - seen:
        problems.add(f"table {name}", "is missing from the plan")
    _check_memory(plan, problems)
    return problems


def check_plan(plan: Plan, source: str | None = None) -> None:
    """InputError naming every problem if ``plan`` is unsound or was edited after planning: what
    a plan handed to training or read from a cache must pass."""
    problems = validate_plan(plan)
    problems.items += identity_problems(plan)
    problems.raise_if_any(f"{source or 'plan ' + plan.plan_id} cannot be used:")


def _check_kind(t: TablePlan, row: dict, device: ComputeDevice, problems: ProblemList) -> None:
    where = f"table {t.name}"
    if not is_available(device, t.sharding_type, t.compute_kernel):
        problems.add(where, f"{t.sharding_type.value}/{t.compute_kernel.value} is not available "
                            f"on {device.value}")
    if row.get("sharding_types") and t.sharding_type.value not in row["sharding_types"]:
        problems.add(where, f"sharding type {t.sharding_type.value} is not in its allow-list "
                            f"{row['sharding_types']}")
    if row.get("compute_kernels") and t.compute_kernel.value not in row["compute_kernels"]:
        problems.add(where, f"compute kernel {t.compute_kernel.value} is not in its allow-list "
                            f"{row['compute_kernels']}")


def _check_shards(t: TablePlan, row: dict, world: int, local: int, problems: ProblemList) -> None:
    where = f"table {t.name}"
    rows, dim = int(row["num_embeddings"]), int(row["embedding_dim"])
    st = t.sharding_type
    if isinstance(t.shards, Replicas) or st is ShardingType.DATA_PARALLEL:
        r = t.shards.replica if isinstance(t.shards, Replicas) else None
        if st is not ShardingType.DATA_PARALLEL or r is None or r.offsets != (0, 0) \
                or r.sizes != (rows, dim) or t.shards.world_size != world:
            problems.add(where, "data_parallel needs one full replica on every rank (and only "
                                "data_parallel is replicated)")
        return
    ranks = [s.rank for s in t.shards]
    if any(not 0 <= r < world for r in ranks):
        problems.add(where, f"rank out of range 0..{world - 1}: {sorted(set(ranks))}")
        return
    if list(t.ranks) != ranks:
        problems.add(where, "ranks do not match the shards' ranks")
    if not _tiles(t, rows, dim):
        problems.add(where, f"shards do not tile the {rows}x{dim} table exactly")
    hosts = {r // local for r in ranks}
    if st is ShardingType.ROW_WISE and ranks != list(range(world)):
        problems.add(where, "row_wise shard i must be on rank i")
    if st in (ShardingType.TABLE_ROW_WISE, ShardingType.TABLE_COLUMN_WISE) and len(hosts) != 1:
        problems.add(where, f"{st.value} shards must stay on one host, found hosts {sorted(hosts)}")
    if st is ShardingType.TABLE_ROW_WISE and [r % local for r in ranks] != list(range(local)):
        problems.add(where, "table_row_wise shard j must be on local rank j of its host")


def _tiles(t: TablePlan, rows: int, dim: int) -> bool:
    """Shards lie inside the table, do not overlap and cover it (area check + interval check)."""
    boxes = [(s.offsets[0], s.offsets[1], s.sizes[0], s.sizes[1]) for s in t.shards]
    if any(r0 < 0 or c0 < 0 or r0 + h > rows or c0 + w > dim for r0, c0, h, w in boxes):
        return False
    if sum(h * w for _, _, h, w in boxes) != rows * dim:
        return False
    if all(c0 == 0 and w == dim for _, c0, _, w in boxes):
        return _disjoint(sorted((r0, r0 + h) for r0, _, h, _ in boxes if h))
    if all(r0 == 0 and h == rows for r0, _, h, _ in boxes):
        return _disjoint(sorted((c0, c0 + w) for _, c0, _, w in boxes if w))
    return all(not (a[0] < b[0] + b[2] and b[0] < a[0] + a[2] and a[1] < b[1] + b[3]
                    and b[1] < a[1] + a[3])
               for i, a in enumerate(boxes) for b in boxes[i + 1:])


def _disjoint(intervals: list[tuple[int, int]]) -> bool:
    return all(prev[1] <= cur[0] for prev, cur in zip(intervals, intervals[1:]))


def _check_memory(plan: Plan, problems: ProblemList) -> None:
    m = plan.metrics
    for kind, used, cap in (("HBM", m.rank_hbm, m.rank_hbm_cap), ("DDR", m.rank_ddr, m.rank_ddr_cap)):
        for r, (u, c) in enumerate(zip(used, cap)):
            if u > c:
                problems.add(f"rank {r}", f"{kind} {u} bytes exceeds its capacity {c} bytes")
