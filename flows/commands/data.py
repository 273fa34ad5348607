"""``shardflow data criteo TSV [TSV ...] --out DIR --rows-per-table N``: turn Criteo click logs into
training data (``DIR/part-*.parquet``, one per input file) and the spec of its 26 tables
(``DIR/spec.yaml``), preprocessed as TorchRec's Criteo pipeline does (docs/criteo.md)."""

from __future__ import annotations

import argparse
import sys
import time

from flows.reports import command, shell_path
from rec.exit_codes import ExitCode
from rec.settings import add_flags


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``data criteo``."""
    from rec.data.criteo import CriteoSettings

    parser = subparsers.add_parser("data", help="make training data from public datasets", description=__doc__)
    commands = parser.add_subparsers(title="data commands", metavar="COMMAND", required=True)
    criteo = commands.add_parser(
        "criteo", help="convert Criteo click logs (TSV, plain or gzip) to training data and its spec",
        description="Convert Criteo click logs (each line: a label, 13 integers, 26 hashed categories; tab-separated; "
                    "plain or gzip) into DIR: part-00000.parquet ... (one per TSV, in order: label, dense, cat_0 .. "
                    "cat_25) and spec.yaml (26 tables t_cat_i, one per feature). TorchRec's preprocessing: dense = "
                    "log(x - min + 2) with min the smallest integer of its file (a missing integer is 0), a category's "
                    "id its hex value modulo --rows-per-table (a missing one 0). Every line is checked first; bad "
                    "lines are named (file and line) and nothing is left in DIR. Train with: shardflow plan "
                    "DIR/spec.yaml --topology T --out P && shardflow train --plan P --data DIR --dense-in-features 13")
    criteo.add_argument("tsv", metavar="TSV", nargs="+", help="Criteo TSV files (day_0, day_0.gz, train.txt ...)")
    criteo.add_argument("--out", metavar="DIR", required=True, help="directory to write: new or empty")
    criteo.add_argument("--rows-per-table", dest="rows_per_table", type=int, metavar="N", required=True,
                        help="rows of each of the 26 tables: a category's id is its hash modulo N")
    add_flags(criteo, CriteoSettings, skip=("rows_per_table",))
    criteo.set_defaults(handler=run_criteo, signals_stop=True)


def run_criteo(args: argparse.Namespace) -> int:
    from flows.progress import on_terminal
    from rec import progress
    from rec.data.criteo import DENSE_IN_FEATURES, TITLE, CriteoSettings, convert_criteo
    from rec.disk_full import DISK_FULL_ERRNOS
    from rec.errors import InputError, Problem
    from rec.settings import check, from_flags

    settings = from_flags(CriteoSettings, args)
    check(settings, "Cannot convert the Criteo logs with these settings:")
    started = time.perf_counter()
    with on_terminal():
        try:
            with progress.step("convert", f"{len(args.tsv)} Criteo file{'s' if len(args.tsv) > 1 else ''}"):
                done = convert_criteo(args.tsv, args.out, settings)
        except OSError as e:
            if e.errno not in DISK_FULL_ERRNOS:
                raise InputError(TITLE, [Problem(f"--out {args.out}", f"cannot write {e.filename or args.out}: "
                                                                      f"{e.strerror or e}")]) from None
            print(f"shardflow data criteo: cannot write {e.filename or args.out}: {e.strerror}; nothing was left in "
                  f"{args.out}", file=sys.stderr)
            return ExitCode.FAILED
    seconds = time.perf_counter() - started
    for source, path, rows, smallest in zip(args.tsv, done.files, done.rows, done.dense_min, strict=True):
        print(f"{source} -> {path}: {rows:,} rows (smallest integer {smallest})")
    print(f"wrote {done.total_rows:,} rows in {len(done.files)} file{'s' if len(done.files) > 1 else ''} to "
          f"{done.out} in {seconds:.1f} s ({done.total_rows / max(seconds, 1e-9):,.0f} rows/s)")
    print(f"spec: {done.spec} (26 tables of {settings.rows_per_table:,} rows, dim {settings.embedding_dim})")
    print("\nnext: plan the tables for your ranks, then train on the data")
    shardflow = command("shardflow")
    print(f"  {shardflow} plan {shell_path(done.spec)} --topology TOPOLOGY.yaml --out PLAN_DIR")
    print(f"  {shardflow} train --plan PLAN_DIR --data {shell_path(done.out)} --dense-in-features {DENSE_IN_FEATURES}")
    return ExitCode.OK
