"""``shardflow spec validate|show|from-model|stats``: check a table spec and look at it before planning,
write the spec of a TorchRec model's embedding modules, or measure the tables' statistics from
training data."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import TYPE_CHECKING

from flows.commands.plan import SPEC_FILES
from rec.exit_codes import ExitCode
from rec.spec import Spec, read_spec
from rec.spec.types import DEFAULT_MODULE
from rec.text_table import render_table
from rec.topology import Topology, read_topology
from rec.units import format_bytes

if TYPE_CHECKING:
    from rec.data.stats import TableStats

SUMMARY_ROWS = 20  # tables the summaries of ``spec stats`` and ``spec show`` (without --all) list


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``spec validate``, ``spec show``, ``spec from-model`` and ``spec stats``."""
    parser = subparsers.add_parser("spec", help="validate, show, write or measure a table spec", description=__doc__)
    commands = parser.add_subparsers(title="spec commands", metavar="COMMAND", required=True)

    validate = commands.add_parser("validate", help="check every table; print the table count and spec hash")
    validate.add_argument("spec", metavar="SPEC", help=f"spec file: {SPEC_FILES}")
    validate.set_defaults(handler=run_validate)

    show = commands.add_parser("show", help="print the tables, their sizes and totals (and the topology)")
    show.add_argument("spec", metavar="SPEC", help=f"spec file: {SPEC_FILES}")
    show.add_argument("--topology", metavar="TOPO", help="topology YAML: also compare the spec's size with its "
                                                         "memory, and list every key with its value or default")
    show.add_argument("--all", action="store_true", help=f"every table (default: the first {SUMMARY_ROWS})")
    show.set_defaults(handler=run_show)

    from_model = commands.add_parser(
        "from-model", help="write the spec of a TorchRec model: every EmbeddingBagCollection and EmbeddingCollection",
        description="Import TARGET, call it, and write a spec with one row per table of every EmbeddingBagCollection "
                    "and EmbeddingCollection in the model it returns, each with its module path. TARGET is "
                    "package.module:function or path/to/file.py:function; the function takes no arguments and "
                    "returns the model (built on the meta device, or any device), or a pair (model, constraints) "
                    "with TorchRec ParameterConstraints by table name (pooling factors, allowed sharding types and "
                    "kernels), or the pair (model, batches) that train --model takes (the batches are not called). "
                    "Modules shardflow does not plan (feature-processed, managed-collision, quantized) "
                    "are listed, one line each, and left out.")
    from_model.add_argument("target", metavar="TARGET", help="package.module:function or path/to/file.py:function")
    from_model.add_argument("--out", metavar="SPEC", required=True,
                            help=f"spec file to write: {SPEC_FILES}")
    from_model.set_defaults(handler=run_from_model)

    from rec.data.stats import StatsSettings
    from rec.settings import add_flags

    stats = commands.add_parser(
        "stats", help="measure each table's statistics from training data and write them into a spec",
        description="Read a sample of DATA (whole row groups chosen at random, only the columns named by the "
                    "tables' feature_names: one list<int64> column of ids per feature) and write SPEC with each "
                    "table's measured pooling_factor (it replaces the spec's), distinct ids per batch, ids out "
                    "of range and hit-rate curve as SPEC2, in the format its extension names (docs/spec.md).")
    stats.add_argument("data", metavar="DATA", help="training data: a Parquet file, a directory, a glob or a URI")
    stats.add_argument("--spec", metavar="SPEC", required=True,
                       help=f"spec file: {SPEC_FILES}")
    stats.add_argument("--out", metavar="SPEC2", required=True,
                       help=f"spec file to write, with the statistics: {SPEC_FILES}")
    add_flags(stats, StatsSettings)
    stats.set_defaults(handler=run_stats, signals_stop=True)


def run_validate(args: argparse.Namespace) -> int:
    spec = read_spec(args.spec)
    print(f"OK: {len(spec)} tables, hash {spec.spec_hash}")
    return ExitCode.OK


def run_from_model(args: argparse.Namespace) -> int:
    import sys

    from rec.disk_full import DiskFull
    from rec.spec import write_spec
    from rec.spec.from_model import spec_from_model
    from rec.spec.read import spec_format

    spec_format(args.out)  # an extension shardflow cannot write fails before the model is imported
    found = spec_from_model(args.target)
    try:
        path = write_spec(found.spec, args.out)
    except DiskFull as e:
        print(f"shardflow spec from-model: cannot write {args.out}: {e.reason}; nothing was written", file=sys.stderr)
        return ExitCode.FAILED
    modules = found.spec.modules
    print(f"wrote {path}: {len(found.spec)} tables in {len(modules)} module{'s' if len(modules) > 1 else ''}, "
          f"hash {found.spec.spec_hash}")
    print(render_modules(found.spec), end="")
    if found.left_out:
        print("left out:")
        for problem in found.left_out:
            print(f"  - {problem}")
    return ExitCode.OK


def run_stats(args: argparse.Namespace) -> int:
    import sys
    import time

    from flows.progress import on_terminal
    from rec import progress
    from rec.data.layout import DataLayout
    from rec.data.sample import read_sample
    from rec.data.stats import StatsSettings, spec_stats, with_stats
    from rec.disk_full import DiskFull
    from rec.settings import check, from_flags
    from rec.spec import write_spec
    from rec.spec.read import spec_format

    settings = from_flags(StatsSettings, args)
    check(settings, "Cannot measure with these settings:")
    spec_format(args.out)  # an extension shardflow cannot write fails before the data is read
    spec = read_spec(args.spec)
    columns = DataLayout.of_spec(spec, dense_in_features=0).id_columns
    started = time.perf_counter()
    with on_terminal():
        with progress.step("sample", f"reading up to {settings.sample_rows:,} rows of {args.data}"):
            sample = read_sample(args.data, columns, settings.sample_rows, settings.seed)
        read_s = time.perf_counter() - started
        with progress.step("stats", f"counting the ids of {len(spec):,} tables"):
            stats = spec_stats(spec, sample, settings.batch_size)
    measured = with_stats(spec, stats, source=f"measured from {args.data}")
    try:
        path = write_spec(measured, args.out)
    except DiskFull as e:
        print(f"shardflow spec stats: cannot write {args.out}: {e.reason}; nothing was written", file=sys.stderr)
        return ExitCode.FAILED
    seconds = time.perf_counter() - started
    print(f"sampled {sample.rows:,} of {sample.total_rows:,} rows ({sample.row_groups:,} row groups) in "
          f"{seconds:.1f} s ({sample.rows / max(read_s, 1e-9):,.0f} rows/s read), batches of {settings.batch_size:,}")
    print(render_stats(spec, stats))
    print(f"wrote {path}: {len(measured)} tables, hash {measured.spec_hash}")
    return ExitCode.OK


def render_stats(spec: Spec, stats: Sequence[TableStats]) -> str:
    """One line per table (the first ``SUMMARY_ROWS``): pooling factor before and after, distinct ids
    per batch, ids out of range, hit rate of a cache of 10% of the rows; then what needs a look."""
    header = ("table", "pooling_factor", "distinct/batch", "out of range", "hit@10%")
    rows = []
    for t, s in list(zip(spec.tables, stats, strict=True))[:SUMMARY_ROWS]:
        new = "kept (no ids)" if s.pooling_factor is None else f"{s.pooling_factor:g}"
        hit = dict(s.hit_rate_curve or ()).get(0.1)
        rows.append((t.key, f"{t.pooling_factor:g} -> {new}", f"{s.distinct_per_batch:,.1f}",
                     f"{s.ids_out_of_range:,}", "-" if hit is None else f"{hit:.1%}"))
    lines = [render_table(header, rows, right=("distinct/batch", "out of range", "hit@10%"))]
    if len(stats) > SUMMARY_ROWS:
        lines.append(f"... {len(stats) - SUMMARY_ROWS:,} more")
    outside = [s.key for s in stats if s.ids_out_of_range]
    if outside:
        named = ", ".join(outside[:3]) + (f" and {len(outside) - 3:,} more" if len(outside) > 3 else "")
        several = len(outside) > 1
        lines.append(f"{len(outside):,} table{'s' if several else ''} ({named}) {'see' if several else 'sees'} ids "
                     "outside their rows: training stops on them under --ids error; --ids modulo or hash maps them")
    empty = [s.key for s in stats if s.pooling_factor is None]
    if empty:
        named = ", ".join(empty[:3]) + (f" and {len(empty) - 3:,} more" if len(empty) > 3 else "")
        lines.append(f"no ids in the sample for {named}: pooling_factor kept as the spec had it")
    return "\n".join(lines)


def run_show(args: argparse.Namespace) -> int:
    spec = read_spec(args.spec)
    topology = read_topology(args.topology) if args.topology else None
    print(render_spec(spec, None if args.all else SUMMARY_ROWS))
    if topology is not None:
        from flows.reports import render_topology

        print(render_fit(spec, topology))
        print(f"\n{render_topology(topology, args.topology)}")
    return ExitCode.OK


def render_spec(spec: Spec, limit: int | None = None) -> str:
    """One aligned line per table (the first ``limit``, and a line saying how many more), then the
    modules (a spec naming any), the totals and the spec hash."""
    header: tuple[str, ...] = ("name", "rows", "dim", "data_type", "pooling", "pooling_factor", "bytes")
    rows: list[tuple[object, ...]] = [
        (t.name, f"{t.num_embeddings:,}", t.embedding_dim, t.data_type.value, t.pooling.value,
         f"{t.pooling_factor:g}", format_bytes(t.bytes))
        for t in spec.tables
    ]  # fmt: skip
    modules = "" if list(spec.modules) == [DEFAULT_MODULE] else render_modules(spec)
    if modules:
        header += ("module",)
        rows = [(*row, t.module) for row, t in zip(rows, spec.tables, strict=True)]
    table = render_table(header, rows[:limit], right=("rows", "dim", "pooling_factor", "bytes")) + more_rows(
        len(rows), limit)
    total_rows = sum(t.num_embeddings for t in spec.tables)
    total_bytes = sum(t.bytes for t in spec.tables)
    return (
        f"{table}\n\n{modules}{len(spec)} tables, {total_rows:,} rows, {format_bytes(total_bytes)} of embedding "
        f"weights\nspec hash: {spec.spec_hash}"
    )


def more_rows(count: int, limit: int | None) -> str:
    """The line under a table cut to its first ``limit`` of ``count`` rows ("" if it was not cut)."""
    if limit is None or count <= limit:
        return ""
    return f"\n... {count - limit:,} more rows (--all shows every row)"


def render_modules(spec: Spec) -> str:
    """One line per embedding module: its path, kind (weighted or not) and table count, in model order."""
    counts: dict[str, int] = {}
    weighted = {t.module for t in spec.tables if t.is_weighted}
    for t in spec.tables:
        counts[t.module] = counts.get(t.module, 0) + 1
    lines = [f"module {path}: {kind.value}{' (weighted)' if path in weighted else ''}, "
             f"{counts[path]} table{'s' if counts[path] > 1 else ''}" for path, kind in spec.modules.items()]
    return "\n".join(lines) + "\n"


def render_fit(spec: Spec, topology: Topology) -> str:
    """How the weights compare with the topology's memory (weights only; optimizer state comes on top)."""
    t = topology
    hosts = f"{t.num_hosts} host{'s' if t.num_hosts > 1 else ''} x {t.local_world_size} {t.compute_device.value} ranks"
    if t.compute_device.value == "cuda":
        memory, per_rank = "HBM", t.hbm_cap * (1 - t.storage_reservation)
        reserve = f" ({t.storage_reservation:.0%} of {format_bytes(t.hbm_cap)} kept free)"
    else:
        memory, per_rank, reserve = "DDR", float(t.ddr_cap), ""
    total = per_rank * t.world_size
    weights = sum(tb.bytes for tb in spec.tables)
    largest = max(spec.tables, key=lambda tb: tb.bytes)
    return (
        f"\ntopology: {hosts}, {format_bytes(per_rank)} usable {memory} per rank{reserve}, "
        f"{format_bytes(total)} in all\n"
        f"weights fill {_percent(weights / total)} of usable {memory}; largest table {largest.name} is "
        f"{format_bytes(largest.bytes)} ({_percent(largest.bytes / per_rank)} of one rank)\n"
        f"topology hash: {t.topology_hash}"
    )


def _percent(fraction: float) -> str:
    return "<0.1%" if 0 < fraction < 0.001 else f"{fraction:.1%}"
