"""The ``shardflow`` command line: builds the parser from ``flows.commands`` and runs one command.

To add a subcommand, write ``flows/commands/NAME.py`` with ``add_parser(subparsers)`` and list the
module in ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from flows.commands import compare, plan, replan, run, serve, spec, train
from rec.errors import InputError

COMMANDS = (spec, plan, train, run, replan, compare, serve)
EXIT_BAD_INPUT = 2


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per module in ``COMMANDS``."""
    parser = argparse.ArgumentParser(
        prog="shardflow", description="Plan how embedding tables are sharded across GPUs, and train with the plan."
    )
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``shardflow`` with ``argv``; returns the exit code (2 for any user mistake)."""
    try:
        args = build_parser().parse_args(argv)
        return args.handler(args)
    except SystemExit as e:  # argparse: usage errors exit 2, --help exits 0
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(f"shardflow: {e.code}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except InputError as e:
        print(f"shardflow: {e.render()}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except OSError as e:
        if e.filename is None:
            raise
        print(f"shardflow: cannot use {e.filename}: {e.strerror or e}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except KeyboardInterrupt:
        print("shardflow: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
