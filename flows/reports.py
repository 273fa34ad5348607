"""What the CLI prints about plans and topologies: the per-rank table, the plan's quality, the
topology with the defaults it relies on, and commands that work as typed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rec.text_table import render_table

if TYPE_CHECKING:
    from rec.plan import Plan
    from rec.profile.types import Profile
    from rec.topology import Topology
    from rec.train.metrics import TrainMetrics
    from tasks.train import Trained

# What each topology key means (the defaults themselves live in rec.topology.validate).
OVERFIT_AUC = 0.005  # an earlier evaluation this much better than the last: worth a line
TOPOLOGY_KEYS = {
    "world_size": "ranks (processes) in all",
    "local_world_size": "ranks per host",
    "compute_device": "cuda or cpu",
    "hbm_cap": "GPU memory per rank",
    "ddr_cap": "host memory per rank; what binds on cpu",
    "intra_host_bw": "between ranks of one host",
    "inter_host_bw": "between hosts",
    "hbm_mem_bw": "GPU memory bandwidth",
    "ddr_mem_bw": "host memory bandwidth",
    "batch_size": "samples per rank and iteration",
    "storage_reservation": "share of HBM kept free for dense parts and activations",
}


def shell_path(path: str | Path) -> str:
    """``path`` as typed in a command this prints for the user to run: shell-quoted, with ``./`` before a
    relative path that starts with ``-`` (which Python names without it: argparse would read a flag)."""
    import shlex

    text = str(path)
    return shlex.quote(f"./{text}" if text.startswith("-") else text)


def render_plan(plan: Plan, all_ranks: bool = False) -> str:
    """Per-rank load and memory (critical rank marked), then the plan's quality and its predicted
    iteration time (``rec.analysis.iteration_time``: printed alike by ``plan``, ``train`` and ``measure``)."""
    from rec.analysis.plan_quality import quality_lines
    from rec.plan.report import rank_table

    table = rank_table(plan, all_ranks)
    note = f"\n{table.note}" if table.note else ""
    quality = "".join(f"{line}\n" for line in [*quality_lines(plan), *cache_lines(plan)])
    return (
        f"{render_table(table.header, table.rows, right=table.right)}{note}\n\n"
        f"{quality}"
        f"{render_movement(plan)}"
        f"plan_id:       {plan.plan_id}  spec_hash {plan.spec_hash}"
    )


def cache_lines(plan: Plan) -> list[str]:
    """One line where FBGEMM's caches (one per kernel group, at its widest cached row) and a rowwise
    optimizer's state of uvm tables (every row in HBM) would take some rank past its usable HBM,
    though the plan's own count fits (``rec.analysis.fbgemm_caches``)."""
    import numpy as np

    from rec.analysis.fbgemm_caches import cache_hbm
    from rec.sharding import ComputeDevice
    from rec.units import format_bytes

    if plan.topology.compute_device is not ComputeDevice.CUDA:
        return []
    caches = cache_hbm(plan)
    over = np.asarray(plan.metrics.rank_hbm) + caches.extra - np.asarray(plan.metrics.rank_hbm_cap)
    if not (over > 0).any():
        return []
    r, n = int(np.argmax(over)), int((over > 0).sum())
    where = f"rank {r}" if n == 1 else f"{n} ranks, most rank {r}"
    return [f"caches:        FBGEMM keeps more of the uvm tables in HBM than planned, past the usable HBM on "
            f"{where}: {format_bytes(caches.built[r])} against {format_bytes(caches.planned[r])} planned, "
            f"{format_bytes(over[r])} over (docs/gpu.md)"]


def render_made_by(plan: Plan) -> str:
    """Which planner made a plan other than shardflow's search, and how long it took; empty otherwise."""
    other = plan.planner.made_by
    if other is None:
        return ""
    proposers = ", ".join(other.proposers)
    return (f"planned by:    {other.name.value} (TorchRec {other.torchrec}'s EmbeddingShardingPlanner: "
            f"{proposers}) in {other.seconds:.2f} s\n")


def render_movement(plan: Plan) -> str:
    """What a replanned plan moves, against the previous plan and a plan from scratch; empty otherwise."""
    from rec.units import format_bytes

    m = plan.metrics.movement
    if m is None:
        return ""
    fresh = m.fresh_critical_path
    versus = f", critical path {plan.metrics.critical_path / fresh:.4f}x a plan from scratch" if fresh else ""
    return (f"moved:         {format_bytes(m.moved_bytes)} of {format_bytes(m.total_bytes)} "
            f"({m.moved_fraction:.2%}) from plan {plan.previous_plan_id}{versus}\n"
            f"tables:        {m.kept_tables} kept, {m.moved_tables} moved, {m.resized_tables} resized, "
            f"{m.added_tables} added, {m.removed_tables} removed, {m.reinitialized_tables} re-initialized\n")


def _topology_values(topology: Topology) -> dict[str, str]:
    from rec.topology.validate import topology_to_dict
    from rec.units import format_bytes

    d = topology_to_dict(topology)
    shown = {}
    for key, value in d.items():
        if key.endswith("_cap"):
            shown[key] = format_bytes(value)
        elif key.endswith("_bw"):
            shown[key] = f"{format_bytes(value)}/s"
        elif key == "storage_reservation":
            shown[key] = f"{value:g}"
        else:
            shown[key] = str(value)
    return shown


def defaulted_keys(topology_path: str) -> list[str]:
    """The topology keys that the file leaves out (their defaults apply)."""
    import yaml

    from rec.topology.validate import KEYS

    try:
        document = yaml.safe_load(Path(topology_path).read_text()) or {}
    except (OSError, yaml.YAMLError):
        return []
    return [k for k in KEYS if k not in document] if isinstance(document, dict) else []


def render_topology_line(topology: Topology, topology_path: str, profile: Profile | None = None) -> str:
    """Two lines for ``plan``: the cluster, and the defaults the file relies on (less the bandwidths
    ``profile`` sets in their place: the plan never used those defaults)."""
    values = _topology_values(topology)
    t = topology
    memory = "hbm_cap" if t.compute_device.value == "cuda" else "ddr_cap"
    line = (f"topology:      {t.world_size:,} {t.compute_device.value} ranks ({t.num_hosts:,} "
            f"host{'s' if t.num_hosts > 1 else ''} x {t.local_world_size}), {memory} {values[memory]} "
            f"per rank, batch_size {t.batch_size} per rank")
    replaced = {k for k, v in vars(profile.bandwidths).items() if v is not None} if profile else set()
    items = [f"{k} {values[k]}" for k in defaulted_keys(topology_path) if k not in replaced]
    if items:
        rows = [" " * 15 + "defaults: " + items[0]]
        for item in items[1:]:  # wrapped between items, never inside one
            if len(rows[-1]) + len(item) + 2 > 100:
                rows[-1] += ","
                rows.append(" " * 25 + item)
            else:
                rows[-1] += f", {item}"
        line += "\n" + "\n".join(rows)
    return line


def render_topology(topology: Topology, topology_path: str) -> str:
    """Every topology key: its value, where it came from, what it means."""
    values = _topology_values(topology)
    absent = set(defaulted_keys(topology_path))
    cpu = topology.compute_device.value == "cpu"

    def source(key: str) -> str:
        if key not in absent:
            return "file"
        if key == "local_world_size":
            return "default: world_size (one host)"
        if key == "hbm_cap" and cpu:
            return "default: cpu ranks have no HBM"
        return "default (TorchRec)"

    rows = [(key, values[key], source(key), meaning) for key, meaning in TOPOLOGY_KEYS.items() if key in values]
    return render_table(("key", "value", "from", "meaning"), rows, right=("value",))


def command(name: str) -> str:
    """How to type the installed command ``name`` from here: bare when the shell finds this very
    program on PATH, else its path (``.venv/bin/shardflow`` from the repository root)."""
    import shutil
    import sys

    own = Path(sys.executable).parent / name
    found = shutil.which(name)
    if found and own.exists() and Path(found).resolve() == own.resolve():
        return name
    if not own.exists():
        return name
    try:
        return str(own.relative_to(Path.cwd()))
    except ValueError:
        return str(own)


def typed(text: str) -> str:
    """``text`` with each command it quotes (`` `shardflow ...` ``) as it is typed from here (``command``)."""
    return text.replace("`shardflow ", f"`{command('shardflow')} ")


def predicted_line(plan: Plan, metrics: TrainMetrics) -> str:
    """``predicted ...; measured ... (p50): 1.316x predicted``: a training's measured p50 beside its
    plan's prediction, as ``train`` and ``run`` print it (only at the plan's batch size)."""
    from rec.analysis.iteration_time import UNCALIBRATED_NOTE, ms, prediction, ratio_text

    predicted = prediction(plan)
    p50 = metrics.iteration_latency_ms.p50
    versus = (f"measured {ms(p50)} (p50): {ratio_text(p50, predicted.iteration_ms)}"
              if metrics.batch_size == predicted.batch_size else
              f"at the plan's batch size {predicted.batch_size} per rank, not this training's {metrics.batch_size}")
    note = f"\nnote      {typed(UNCALIBRATED_NOTE)}" if plan.planner.profile.is_default else ""
    return f"predicted {predicted.text()}; {versus}{note}"


def data_lines(metrics: TrainMetrics) -> list[str]:
    """What the training read and how long it waited for it; its last evaluation."""
    lines = []
    data, wait = metrics.data, metrics.data_wait_ms
    if data is not None:
        read = ("synthetic batches" if data.source == "synthetic" else
                f"{data.source} ({data.rows:,} rows in {data.files:,} file{'s' if data.files != 1 else ''}): "
                f"{data.epochs:.2f} epochs, ids {data.ids}, {'shuffled' if data.shuffle else 'in order'} "
                f"(seed {data.seed})")
        waited = ""
        if wait is not None:
            share = wait.p50 / metrics.iteration_latency_ms.p50 if metrics.iteration_latency_ms.p50 > 0 else 0.0
            waited = f"; waited for data p50 {wait.p50:.2f} ms per iteration ({share:.1%} of it)"
        lines.append(f"data      {read}{waited}")
        if data.resumed:  # under the data line: what the resume read
            lines.append(f"{'':10}{data.resumed}")
    if metrics.eval is not None:
        values = shown_metrics(metrics.eval)
        samples = int(metrics.eval.get("samples") or 0)
        lines.append(f"eval      {values} on {samples:,} held-out samples"
                     + (f" ({len(metrics.evaluations)} evaluations)" if len(metrics.evaluations) > 1 else ""))
        earlier = best_earlier(metrics)
        if earlier:
            lines.append(f"{'':10}{earlier}")
    return lines


def shown_metrics(values: Mapping[str, Any]) -> str:
    """``auc 0.7887, logloss 0.4569, ne 0.8132``; the metrics one class of labels leaves undefined
    (AUC, NE: null in the metrics files) are named as such, not left out."""
    shown = ", ".join(f"{k} {v:.4f}" for k, v in values.items() if k != "samples" and v is not None)
    undefined = [k for k, v in values.items() if k != "samples" and v is None]
    if undefined:
        shown += (f" ({' and '.join(undefined)} undefined: every label of the evaluation data is the same; "
                  "evaluate on data of both classes)")
    return shown


def best_earlier(metrics: TrainMetrics) -> str:
    """Where an evaluation during the training did clearly better than the last one (AUC higher by
    more than OVERFIT_AUC): the line saying so, since the model went on to overfit; else nothing."""
    scored = [(float(auc), int(e.get("iteration") or 0)) for e in metrics.evaluations
              if isinstance(auc := e.get("auc"), (int, float))]
    final = metrics.eval.get("auc") if metrics.eval else None
    if len(scored) < 2 or not isinstance(final, (int, float)):
        return ""
    auc, iteration = max(scored, key=lambda s: (s[0], -s[1]))
    if auc - final <= OVERFIT_AUC:
        return ""
    return (f"best auc {auc:.4f} after iteration {iteration}: the model overfit after it (fewer --iterations, or "
            "lower learning rates)")


def render_resumed(metrics: TrainMetrics, resume_from: str | None) -> str:
    """Where a training that resumed started from: another plan's checkpoint (``--resume-from``:
    which plan and step, tables restored, resized and initialized) or its own; empty otherwise."""
    resume = metrics.resume
    if resume:
        dense = len(resume.dense_reinitialized)
        return (f"resumed   from plan {resume.from_plan_id} at step {resume.step} ({resume_from}): "
                f"{resume.tables_restored} tables restored, {resume.tables_resized} resized, "
                f"{resume.tables_initialized} initialized"
                + (f"; {dense} dense layer{'s' if dense > 1 else ''} initialized" if dense else ""))
    other = metrics.resumed_run
    if metrics.resumed_from and other is not None:
        return (f"resumed   from run {other.run_id}'s checkpoint at step {metrics.resumed_from} "
                f"(--out {other.out_dir})")
    restarted = (f", after {metrics.restarts} restart{'s' if metrics.restarts > 1 else ''} of the ranks "
                 "(a rank failed; --max-restarts)") if metrics.restarts else ""
    if metrics.resumed_from:
        return f"resumed   from this plan's own checkpoint at step {metrics.resumed_from}{restarted}"
    if restarted:
        return f"restarted from iteration 0 (no checkpoint yet){restarted}"
    return ""


def resumed_lines(trained: Trained) -> list[str]:
    """``resumed ...`` where the training went on from a checkpoint (``render_resumed``)."""
    assert trained.metrics is not None, "node 0's training: it has the metrics"
    resumed = render_resumed(trained.metrics, trained.settings.job.resume_from)
    return [resumed] if resumed else []


def checkpoint_lines(trained: Trained) -> list[str]:
    """``checkpoints DIR`` where the training wrote checkpoints."""
    from rec.train.resume import checkpoint_dir

    job = trained.settings.job
    directory = checkpoint_dir(job, trained.out_dir)
    return [f"checkpoints {directory}"] if directory and job.checkpoint_every else []
