"""``plan.json``'s text from a ``Plan`` (docs/plan-format.md): identical plans give identical bytes.

The typed values become plan.json's keys here and only here (``rec.plan.parse`` reads them back):
the topology in its YAML keys and units, the planner identity as the plan_id covers it, the metrics,
one line per table and per spec row.
"""

from __future__ import annotations

import json
from dataclasses import asdict, fields
from typing import Any

import numpy as np

from rec.config.planner_identity import PlannerIdentity
from rec.plan.metrics import Movement, PlanMetrics
from rec.plan.types import Plan
from rec.profile import profile_record
from rec.sharding import COMPUTE_KERNELS, SHARDING_TYPES
from rec.spec.columns import table_to_row
from rec.spec.types import DEFAULT_MODULE
from rec.topology import topology_to_dict

PLAN_FILE = "plan.json"
SHARDING_VALUES = [m.value for m in SHARDING_TYPES]
KERNEL_VALUES = [m.value for m in COMPUTE_KERNELS]


def planner_to_dict(planner: PlannerIdentity) -> dict[str, Any]:
    """``planner`` as plan.json holds it, and as its plan_id covers it (key order as always written)."""
    cost = {f.name: getattr(planner.cost, f.name) for f in fields(planner.cost) if f.name != "profile"}
    cost["optimizer"] = planner.cost.optimizer.value
    out: dict[str, Any] = {"cost": cost}
    if planner.search is not None:
        out["search"] = {k: v for k, v in asdict(planner.search).items() if k not in planner.unrecorded}
    if planner.backend is not None:
        out.update(backend=planner.backend, groups=planner.groups)
    if planner.previous_plan_id is not None:
        out.update(previous_plan_id=planner.previous_plan_id, max_regress=planner.max_regress)
    if not planner.profile.is_default:
        out["profile"] = profile_record(planner.profile)
    if planner.made_by is not None:
        m = planner.made_by
        out["made_by"] = {"name": m.name.value, "torchrec": m.torchrec, "proposers": list(m.proposers),
                          "seconds": m.seconds}
    return out


def movement_to_dict(movement: Movement) -> dict[str, Any]:
    """What plan.json's ``metrics.movement`` holds (the per-rank bytes also go to movement.parquet)."""
    d = asdict(movement)
    d["bytes_in"], d["bytes_out"] = list(movement.bytes_in), list(movement.bytes_out)
    return d


def metrics_to_dict(metrics: PlanMetrics) -> dict[str, Any]:
    out = {f.name: getattr(metrics, f.name) for f in fields(metrics) if f.name != "movement"}
    for key in ("rank_perf", "rank_hbm", "rank_ddr", "rank_hbm_cap", "rank_ddr_cap"):
        out[key] = list(out[key])
    out["bound_method"] = str(metrics.bound_method)
    if metrics.movement is not None:
        out["movement"] = movement_to_dict(metrics.movement)
    return out


def plan_to_dict(plan: Plan) -> dict[str, Any]:
    """The plan as plan.json holds it (for inspection; ``dumps_plan`` writes the text)."""
    import orjson

    payload: dict[str, Any] = orjson.loads(dumps_plan(plan))
    return payload


def _header(plan: Plan) -> dict[str, Any]:
    previous = {"previous_plan_id": plan.previous_plan_id} if plan.previous_plan_id else {}
    return {"format": plan.format, "plan_id": plan.plan_id, "spec_hash": plan.spec_hash, **previous,
            "topology": topology_to_dict(plan.topology), "planner": planner_to_dict(plan.planner),
            "tables": None, "metrics": metrics_to_dict(plan.metrics), "spec": None}


def table_lines(plan: Plan) -> list[str]:
    """One JSON object per table, written from the columns (100,000 tables in well under a second)."""
    c = plan.columns
    names = [json.dumps(n) if m == DEFAULT_MODULE else f'{json.dumps(n)},"module":{json.dumps(m)}'
             for n, m in zip(c.names, c.modules, strict=True)]  # v3: the module after the name
    st = [SHARDING_VALUES[x] for x in c.sharding_type.tolist()]
    ck = [KERNEL_VALUES[x] for x in c.compute_kernel.tolist()]
    perf, hbm, ddr = map(list, (c.perf.tolist(), c.hbm.tolist(), c.ddr.tolist()))
    start, replicated = c.shard_start.tolist(), c.replicated.tolist()
    assert c.load_factor is not None
    caches = {int(i): f',"cache_load_factor":{float(c.load_factor[i])!r}'
              for i in np.flatnonzero(~np.isnan(c.load_factor))}
    rank, r0, c0, nr, nc = (getattr(c, f).tolist() for f in ("rank", "row_offset", "col_offset", "rows", "cols"))
    lines = []
    for i in range(len(names)):
        lo, hi = start[i], start[i + 1]
        head = f'{{"name":{names[i]},"sharding_type":"{st[i]}","compute_kernel":"{ck[i]}"{caches.get(i, "")},'
        est = f'"est":{{"perf":{perf[i]!r},"storage":{{"hbm":{hbm[i]},"ddr":{ddr[i]}}}}}}}'
        if replicated[i]:  # v2: one replica stands for one on every rank
            lines.append(f'{head}"replicated":true,"shards":[{{"offsets":[{r0[lo]},{c0[lo]}],'
                         f'"sizes":[{nr[lo]},{nc[lo]}]}}],{est}')
            continue
        shards = ",".join([f'{{"rank":{rank[j]},"offsets":[{r0[j]},{c0[j]}],"sizes":[{nr[j]},{nc[j]}]}}'
                           for j in range(lo, hi)])
        lines.append(f'{head}"ranks":[{",".join(map(str, rank[lo:hi]))}],"shards":[{shards}],{est}')
    return lines


def dumps_plan(plan: Plan) -> str:
    """One line per top-level key, table and spec row: readable, diffable, and fast to write."""
    import orjson

    lines = ["{"]
    items = list(_header(plan).items())
    for i, (key, value) in enumerate(items):
        comma = "," if i < len(items) - 1 else ""
        if key == "tables":
            body = ",\n  ".join(table_lines(plan))
        elif key == "spec":
            body = b",\n  ".join(orjson.dumps(table_to_row(t)) for t in plan.spec.tables).decode()
        else:
            lines.append(f"{json.dumps(key)}: {orjson.dumps(value).decode()}{comma}")
            continue
        lines.append(f"{json.dumps(key)}: [\n  {body}\n]{comma}" if body else f"{json.dumps(key)}: []{comma}")
    return "\n".join(lines) + "\n}\n"
