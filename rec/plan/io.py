"""``plan.json`` and ``shards.parquet``: deterministic, so identical plans give identical bytes.

``metrics.planning_s`` is the one measured value in ``plan.json``; every other byte depends only
on the inputs.
"""

from __future__ import annotations

import json
import os
import tempfile
from dataclasses import asdict
from pathlib import Path

from rec.errors import InputError, Problem
from rec.plan.types import PLAN_FORMAT, Plan, PlanMetrics, Shard, TablePlan
from rec.sharding import ComputeKernel, ShardingType

PLAN_FILE = "plan.json"
SHARDS_FILE = "shards.parquet"


def plan_to_dict(plan: Plan) -> dict:
    return {
        "format": PLAN_FORMAT,
        "plan_id": plan.plan_id,
        "spec_hash": plan.spec_hash,
        "topology": plan.topology,
        "planner": plan.planner,
        "tables": [_table_to_dict(t) for t in plan.tables],
        "metrics": asdict(plan.metrics),
        "spec": list(plan.spec_tables),
    }


def _table_to_dict(t: TablePlan) -> dict:
    return {
        "name": t.name,
        "sharding_type": t.sharding_type.value,
        "compute_kernel": t.compute_kernel.value,
        "ranks": list(t.ranks),
        "shards": [{"rank": s.rank, "offsets": list(s.offsets), "sizes": list(s.sizes)}
                   for s in t.shards],
        "est": {"perf": t.perf, "storage": {"hbm": t.hbm, "ddr": t.ddr}},
    }


def plan_from_dict(d: dict, source: str = "plan") -> Plan:
    """Parse a plan.json payload; a malformed one is an InputError naming what is wrong."""
    if d.get("format") != PLAN_FORMAT:
        raise InputError(f"{source} is not a shardflow plan:",
                         [Problem("format", f"expected {PLAN_FORMAT!r}, got {d.get('format')!r}")])
    try:
        tables = tuple(TablePlan(
            name=t["name"],
            sharding_type=ShardingType(t["sharding_type"]),
            compute_kernel=ComputeKernel(t["compute_kernel"]),
            ranks=tuple(t["ranks"]),
            shards=tuple(Shard(s["rank"], tuple(s["offsets"]), tuple(s["sizes"])) for s in t["shards"]),
            perf=float(t["est"]["perf"]),
            hbm=int(t["est"]["storage"]["hbm"]),
            ddr=int(t["est"]["storage"]["ddr"]),
        ) for t in d["tables"])
        m = d["metrics"]
        metrics = PlanMetrics(**{k: tuple(v) if isinstance(v, list) else v for k, v in m.items()})
        return Plan(d["plan_id"], d["spec_hash"], d["topology"], d.get("planner", {}), tables,
                    metrics, tuple(d.get("spec", ())))
    except (KeyError, TypeError, ValueError) as e:
        raise InputError(f"{source} is not a valid shardflow plan:",
                         [Problem(type(e).__name__, str(e))]) from None


def dumps_plan(plan: Plan) -> str:
    """Pretty at the top, one line per table and spec row: readable, diffable, and written by
    the C JSON encoder (``indent`` would fall back to the pure-Python one, 5x slower)."""
    d = plan_to_dict(plan)
    lines = ["{"]
    items = list(d.items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if key in ("tables", "spec") and value:
            body = ",\n".join("  " + _compact(v) for v in value)
            lines.append(f"{json.dumps(key)}: [\n{body}\n]{comma}")
        else:
            lines.append(f"{json.dumps(key)}: {_compact(value)}{comma}")
    return "\n".join(lines) + "\n}\n"


def _compact(value: object) -> str:
    return json.dumps(value, separators=(", ", ": "), allow_nan=False)


def read_plan(path: str | Path) -> Plan:
    path = Path(path)
    if path.is_dir():
        path = path / PLAN_FILE
    try:
        payload = json.loads(path.read_text())
    except FileNotFoundError:
        raise InputError("Cannot read the plan:", [Problem(str(path), "no such file")]) from None
    except (OSError, json.JSONDecodeError) as e:
        raise InputError("Cannot read the plan:", [Problem(str(path), str(e))]) from None
    return plan_from_dict(payload, str(path))


def shard_rows(plan: Plan) -> dict[str, list]:
    """One row per shard, as columns (``shards.parquet``)."""
    rows = [(t.name, t.sharding_type.value, t.compute_kernel.value, i, s.rank, *s.offsets[:2], *s.sizes[:2])
            for t in plan.tables for i, s in enumerate(t.shards)]
    names = ("table", "sharding_type", "compute_kernel", "shard", "rank",
             "row_offset", "col_offset", "rows", "cols")
    columns = [list(c) for c in zip(*rows)] if rows else [[] for _ in names]
    return {"plan_id": [plan.plan_id] * len(rows), **dict(zip(names, columns))}


def write_plan(plan: Plan, out_dir: str | Path) -> Path:
    """Write plan.json and shards.parquet atomically: a reader never sees a partial artifact."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out, prefix=".tmp-plan-") as tmp:
        tmp_plan = Path(tmp) / PLAN_FILE
        tmp_plan.write_text(dumps_plan(plan))
        tmp_shards = Path(tmp) / SHARDS_FILE
        columns = shard_rows(plan)
        table = pa.Table.from_arrays([_arrow_column(v) for v in columns.values()],
                                     names=list(columns))
        pq.write_table(table, tmp_shards, compression="zstd", write_statistics=False)
        os.replace(tmp_shards, out / SHARDS_FILE)
        os.replace(tmp_plan, out / PLAN_FILE)
    return out / PLAN_FILE


def _arrow_column(values: list):
    """An Arrow array built from raw buffers: ``pa.array`` would import pandas (0.4 s) just to
    check whether ``values`` is a pandas object, which dominates planning 500 tables."""
    import numpy as np
    import pyarrow as pa

    if values and isinstance(values[0], str):
        encoded = [v.encode() for v in values]
        offsets = np.zeros(len(encoded) + 1, dtype=np.int32)
        np.cumsum([len(e) for e in encoded], out=offsets[1:])
        buffers = [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded))]
        return pa.Array.from_buffers(pa.string(), len(values), buffers)
    ints = np.asarray(values, dtype=np.int64)
    return pa.Array.from_buffers(pa.int64(), len(ints), [None, pa.py_buffer(ints)])
