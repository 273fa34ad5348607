"""``shardflow eval --checkpoint DIR --data PATH``: evaluate a checkpoint's model on data, on the
ranks of the plan it was trained with.

DIR is a checkpoint directory (its newest checkpoint), one checkpoint in it (``step_00000400``), or a
training's output directory. The model (from the checkpoint's ``model.json``) is sharded with the
checkpoint's plan under torchrun, as in training, and run forward over every row of PATH (or
``--eval-batches`` batches per rank): AUC, logloss and normalized entropy over every rank's samples,
written to OUT/eval_metrics.json (``eval``: the same keys as train_metrics.json's). Checked first
(the checkpoint, the data's columns and a sample of rows, the machine): a problem exits 2 in seconds.
"""

from __future__ import annotations

import argparse

from rec.exit_codes import ExitCode
from rec.settings import add_flags


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from tasks.evaluate import EvalCheckpointSettings

    p = subparsers.add_parser("eval", help="evaluate a checkpoint on data (AUC, logloss, NE; eval_metrics.json)",
                              description=__doc__)
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="a checkpoint directory (its newest checkpoint), one step_<8 digits> in it"
                        " (step_00000400), or a training's --out")
    p.add_argument("--data", required=True, metavar="PATH",
                   help="Parquet data with labels: a file, a directory, a glob or a URI (docs/training.md)")
    p.add_argument("--out", default=None, metavar="DIR",
                   help="eval_metrics.json and logs/ go here, DIR locked for the run "
                        "(default: a new out/<plan_id>/eval-<time>, out/latest the newest)")
    add_flags(p, EvalCheckpointSettings)
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    import sys

    from flows.commands.launch_faults import launch_faults
    from flows.progress import on_terminal
    from flows.reports import shown_metrics
    from rec.plan import read_plan
    from rec.settings import check, from_flags
    from rec.train.resume import PLAN_COPY, checkpoint_at
    from tasks.evaluate import EvalCheckpointSettings, evaluate_checkpoint
    from tasks.run_dirs import RunDirs
    from tasks.train import TrainingFailed, listed

    settings = from_flags(EvalCheckpointSettings, args)
    check(settings, "Cannot evaluate with these settings:")
    dirs = RunDirs.of(args.out)
    with launch_faults("shardflow eval", lambda: args.out or ".") as fault, on_terminal(), \
            dirs.locked(settings.ranks.node_rank):
        directory, _ = checkpoint_at(args.checkpoint)
        plan_id = read_plan(directory / PLAN_COPY).plan_id if (directory / PLAN_COPY).is_file() else "checkpoint"
        out = dirs.train_dir(plan_id, nested=False, kind="eval")
        try:
            evaluated = evaluate_checkpoint(args.checkpoint, args.data, out, settings)
        except TrainingFailed as e:
            print(f"shardflow eval: the evaluation failed: {e.cause}{listed(e.problems)}\n  logs: {e.logs}",
                  file=sys.stderr)
            return ExitCode.of_failure(e.deterministic)
        dirs.mark_latest(out)
    if fault.code is not None:
        return fault.code
    metrics = evaluated.metrics
    if metrics is None:
        print(f"eval      done on node {settings.ranks.node_rank}; node 0 writes eval_metrics.json")
        return ExitCode.OK
    values = metrics["eval"]
    shown = shown_metrics(values)
    print(f"eval      checkpoint of iteration {metrics['step']} (plan {metrics['plan_id']}) on "
          f"{values['samples']:,} samples of {args.data}: {shown}")
    print(f"wrote     {out}/eval_metrics.json")
    return ExitCode.OK
