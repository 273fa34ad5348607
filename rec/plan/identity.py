"""``plan_id``: the same spec, topology and planner configuration give the same id."""

from __future__ import annotations

from rec.hashing import content_hash
from rec.plan.types import PLAN_FORMAT


def plan_id(spec_hash: str, topology_hash: str, planner: dict) -> str:
    return content_hash({"format": PLAN_FORMAT, "spec": spec_hash, "topology": topology_hash,
                         "planner": planner})
