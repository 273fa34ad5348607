"""``shardflow export --checkpoint DIR --out DIR2``: a checkpoint's model, unsharded, for use outside
shardflow's training job.

DIR is a checkpoint directory (its newest checkpoint), one checkpoint in it (``step_00000400``), or a
training's output directory. DIR2 gets ``model.safetensors`` (every tensor of the model, each table
whole, without pickle) and ``model.json`` (what defines the model: kind, dense and over arch sizes,
dense width, the tables and features in the order the model reads them, the ``--ids`` policy, and
the plan and step the weights come from). ``shardflow predict --model DIR2`` uses it;
docs/training.md shows loading it from plain Python. No process group, no GPU needed.
"""

from __future__ import annotations

import argparse

from rec.exit_codes import ExitCode


def add_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = subparsers.add_parser("export", help="a checkpoint's model, unsharded: model.safetensors + model.json",
                              description=__doc__)
    p.add_argument("--checkpoint", required=True, metavar="DIR",
                   help="a checkpoint directory (its newest checkpoint), one step_<8 digits> in it"
                        " (step_00000400), or a training's --out")
    p.add_argument("--out", required=True, metavar="DIR2", help="where model.safetensors and model.json go")
    p.set_defaults(handler=run, signals_stop=True)


def run(args: argparse.Namespace) -> int:
    from flows.progress import on_terminal
    from flows.reports import command, shell_path
    from rec import progress
    from rec.train.export import export

    with on_terminal(), progress.step("export", "reading the checkpoint"):
        exported = export(args.checkpoint, args.out)
    print(f"exported  the model of plan {exported.plan_id or '-'} at iteration {exported.step}: "
          f"{exported.tensors} tensors, {exported.parameters:,} parameters")
    print(f"wrote     {exported.out_dir}/model.safetensors, {exported.out_dir}/model.json")
    print(f"next      {command('shardflow')} predict --model {shell_path(exported.out_dir)} --data PATH "
          "--out predictions.parquet")
    return ExitCode.OK
