"""``shardflow predict --model DIR2 --data PATH --out FILE.parquet``: an exported model's click
probability for every row of a dataset.

DIR2 is what ``shardflow export`` wrote. PATH is read as training reads it (a Parquet file, a
directory, a glob or a URI; the model's feature columns and ``dense``, ``label`` not needed; ids
treated by the model's ``--ids`` policy, every row checked). FILE gets one column ``prediction``
(float32), one row per input row, in input order; it is written whole or not at all, and never over
an existing file.
"""

from __future__ import annotations

import argparse
import os

from rec.exit_codes import ExitCode
from rec.units import counted

DEVICES = ("cpu", "cuda")


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("predict", help="an exported model's predictions for a dataset (Parquet)",
                              description=__doc__)
    p.add_argument("--model", required=True, metavar="DIR2", help="an exported model (shardflow export --out)")
    p.add_argument("--data", required=True, metavar="PATH", help="Parquet data: a file, a directory, a glob or a URI")
    p.add_argument("--out", required=True, metavar="FILE", help="the predictions (Parquet, one column: prediction)")
    p.add_argument("--device", choices=DEVICES, default="cpu", help="where the model runs (default: cpu)")
    p.add_argument("--batch-size", type=int, default=8192, metavar="N", help="rows per forward (default: 8192)")
    p.set_defaults(handler=run, signals_stop=True)


def run(args: argparse.Namespace) -> int:
    from flows.progress import on_terminal
    from rec import progress
    from rec.errors import InputError, Problem

    problems = []
    model = str(args.model)
    if os.path.isdir(os.path.join(model, "checkpoints")):  # a training's folder: its model is exported first
        problems.append(Problem("--model", f"{model} is a training's folder: shardflow export --checkpoint {model} "
                                           "--out MODEL, then predict with --model MODEL"))
    elif not os.path.lexists(model):
        hint = "a model of your own (TARGET) is not exported: predict takes shardflow's model" if ":" in model \
            else "no such directory"
        problems.append(Problem("--model", f"{model}: {hint}; --model is the folder shardflow export wrote"))
    if not 1 <= args.batch_size <= 1 << 20:
        problems.append(Problem("--batch-size", f"must be from 1 to {1 << 20:,}, got {args.batch_size}"))
    if not str(args.out).lower().endswith((".parquet", ".pq")):
        problems.append(Problem("--out", f"{args.out}: the predictions are Parquet: name a .parquet file"))
    elif os.path.lexists(args.out):  # perhaps the data itself, or another run's predictions
        problems.append(Problem("--out", f"{args.out} exists: predict writes a new file; name another, or remove it"))
    import torch

    if args.device == "cuda" and not torch.cuda.is_available():
        problems.append(Problem("--device cuda", "no CUDA device is visible here; use --device cpu"))
    if problems:
        raise InputError("Cannot predict:", problems)
    from rec.train.predict import predict

    with on_terminal(), progress.step("predict", "reading the model and the data"):
        done = predict(args.model, args.data, args.out, torch.device(args.device), args.batch_size,
                       lambda rows, total: progress.update(f"{rows:,}/{total:,} rows", rows, total))
    print(f"predicted {counted(done.rows, 'row')}")
    if done.undefined:
        print(f"note      {done.undefined:,} of the predictions are NaN: the model's output is not finite for "
              "those rows (dense values too large for it?)")
    print(f"wrote     {done.out} (column prediction: the click probability, one row per input row, in order)")
    return ExitCode.OK
