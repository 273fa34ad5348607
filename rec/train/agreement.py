"""The settings every rank of a training must share, compared once the process group is up and
before anything else runs a collective.

Each node's ``shardflow train`` hands its own flags to its ranks. Nodes started with different
``--iterations`` (batch size, pipeline, data, checkpoints, another plan, ...) still meet in the
rendezvous, whose id names only the kind of job (``tasks.launch``), and then run different
collectives: the ranks wait for each other until the backend's timeout (10 minutes), or, where the
collectives happen to line up, train on data and weights that no longer fit together. One gather of
a digest finds a difference; only then does each differing node send its settings, so that the error
names the settings and every node's values.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import Any

from rec.errors import InputError, Problem
from rec.hashing import HASH_CHARS, canonical_json
from rec.plan import Plan
from rec.plan.plan_json import dumps_plan
from rec.settings import flag_name, is_path, to_dict
from rec.train.collectives import Group
from rec.train.config import NODE_RANK_ENV, TARGET_SEPARATOR, TrainConfig

# Settings of one node's own resources, which may differ between nodes (a node with more cores reads
# with more threads); every other training setting shapes the collectives or what is trained.
NODE_LOCAL = frozenset({"prefetch_batches", "read_threads"})
MAX_VALUE = 60  # characters of a value in the message: a few settings on a few nodes fit its one line
_DIGEST_BYTES = 6  # 48 bits: exact in the float64 values Group's collectives carry


def shared_settings(plans: Plan | Sequence[Plan], config: Any) -> dict[str, object]:
    """What must be the same on every rank, by flag: the plans (each one's id and content, which the
    plan_id does not cover: another search of the same inputs may place the tables elsewhere) and
    every setting of ``config`` (a job's settings dataclass: ``TrainConfig``, ``MeasureConfig``) but
    ``NODE_LOCAL``."""
    plans = [plans] if isinstance(plans, Plan) else list(plans)
    shared: dict[str, object] = {"--plan": ", ".join(
        f"{p.plan_id} (content {hashlib.sha256(dumps_plan(p).encode()).hexdigest()[:HASH_CHARS]})" for p in plans)}
    values = to_dict(config)
    # compared as they take effect: the topology's batch size where none is given, a path from the
    # node's own working directory
    if isinstance(config, TrainConfig):
        values["batch_size"] = config.batch_size or plans[0].topology.batch_size
        if config.model_target and config.model.partition(TARGET_SEPARATOR)[0].endswith(".py"):
            file, _, name = config.model.partition(TARGET_SEPARATOR)
            values["model"] = f"{os.path.abspath(file)}{TARGET_SEPARATOR}{name}"
    for f in fields(config):
        if f.name not in NODE_LOCAL:
            value = values[f.name]
            shared[f"--{flag_name(f)}"] = os.path.abspath(value) if is_path(f) and isinstance(value, str) else value
    return shared


def node_rank() -> int:
    """This rank's node: the launcher's --node-rank, else torchrun's number for it."""
    return int(os.environ.get(NODE_RANK_ENV) or os.environ.get("GROUP_RANK") or 0)


def check_agreement(group: Group, shared: Mapping[str, object]) -> None:
    """Return when every rank has the same ``shared`` settings; otherwise, on every rank, an
    InputError naming the settings that differ and each node's values. Every rank calls it."""
    text = canonical_json(dict(shared))
    digest = int.from_bytes(hashlib.sha256(text.encode()).digest()[:_DIGEST_BYTES], "big")
    every = [(int(t[0]), int(t[1])) for t in group.all_gather([float(digest), float(node_rank())])]
    if len({d for d, _ in every}) == 1:
        return
    firsts: dict[int, int] = {}  # digest -> the first rank that has it, which sends its settings;
    for rank, (d, _) in sorted(enumerate(every), key=lambda r: (r[1][1], r[0])):  # by node: as the user numbers them
        firsts.setdefault(d, rank)
    sent = {d: json.loads(group.broadcast_bytes(text.encode(), src=rank)) for d, rank in firsts.items()}
    raise InputError("The nodes were started with different settings (start every node with the same):",
                     [_difference(sent, every)])


def _difference(sent: Mapping[int, Mapping[str, object]], every: list[tuple[int, int]]) -> Problem:
    """One problem (the launcher reports a rank's first): the differing settings, then their values on
    each group of nodes that share them, e.g. ``--iterations, --warmup: 6, 1 on node 0; 7, 2 on node 1``."""
    names = list(dict.fromkeys(name for values in sent.values() for name in values))
    differ = [n for n in names if len({canonical_json(v.get(n)) for v in sent.values()}) > 1]
    labels = {d: _nodes(sorted({node for digest, node in every if digest == d})) for d in sent}
    if len(set(every)) > len({node for _, node in every}):  # one node's ranks differ among themselves
        labels = {d: f"{label} ({_ranks([r for r, (digest, _) in enumerate(every) if digest == d])})"
                  for d, label in labels.items()}
    on_nodes = [f"{', '.join(_shown(values.get(n)) for n in differ)} on {labels[d]}" for d, values in sent.items()]
    return Problem(", ".join(differ), "; ".join(on_nodes))


def _nodes(nodes: list[int]) -> str:
    return f"node{'s' if len(nodes) > 1 else ''} {', '.join(map(str, nodes))}"


def _ranks(ranks: list[int]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))}"


def _shown(value: object) -> str:
    """A setting's value as its flag takes it (``64 32``, ``none``), cut to a readable length."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return " ".join(map(str, value))
    text = str(value)
    return text if len(text) <= MAX_VALUE else text[:MAX_VALUE - 3] + "..."
