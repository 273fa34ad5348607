"""docs/cli.md from the parser itself, so the reference cannot drift from the flags.

    .venv/bin/python -m flows.cli_reference > docs/cli.md     (make docs)
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator

from rec.exit_codes import ExitCode

HEADER = (
    "# `shardflow` command line\n\n"
    "Generated from the parser by `make docs` (`python -m flows.cli_reference`); a test checks it is up\n"
    "to date. Every flag's default comes from the settings dataclass it belongs to.\n\n"
    f"Exit codes: {ExitCode.OK} success; {ExitCode.BAD_INPUT} bad input (a one-screen message naming every "
    "problem, nothing written),\n"
    "including a training failure that would repeat (a rank found bad input or the user's model code\n"
    f"exited, CUDA or NCCL missing); {ExitCode.FAILED} failed for good otherwise (a training, a Prefect server "
    "that did not\n"
    "start or was lost, `serve` whose server died, `outbox retry` with records still waiting);\n"
    f"{ExitCode.INTERRUPTED} interrupted (Ctrl-C), 128 + N stopped by signal N (143 SIGTERM, 129 SIGHUP); "
    f"{ExitCode.BROKEN_PIPE} the reader\nof the output went away. A full disk (or a failing one: `EIO`) is "
    f"{ExitCode.FAILED}, naming the file.\n\n"
    "Every command first raises its open-files limit (`ulimit -n`) to the hard limit, up to 65,536, and\n"
    f"refuses ({ExitCode.BAD_INPUT}) a hard limit below 64, and paths (or a working directory) that are not "
    "UTF-8 text.\n"
)


def render(parser: argparse.ArgumentParser | None = None) -> str:
    from flows.cli import build_parser

    os.environ["COLUMNS"] = "100"  # argparse wraps usage to the terminal: make it the same everywhere
    parser = parser or build_parser()
    out = [HEADER]
    for name, sub in _subcommands(parser):
        out.append(_command(f"shardflow {name}", sub))
    return "\n".join(out).rstrip() + "\n"


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                nested = list(_subcommands(sub))
                if nested:
                    yield from ((f"{name} {child}", p) for child, p in nested)
                else:
                    yield name, sub


def _command(title: str, parser: argparse.ArgumentParser) -> str:
    lines = [f"## `{title}`", ""]
    description = (parser.description or "").strip()
    if description:
        lines += [description, ""]
    lines += ["```", parser.format_usage().strip().removeprefix("usage: "), "```", ""]
    for group in parser._action_groups:
        actions = [a for a in group._group_actions if a.help != argparse.SUPPRESS and a.dest != "help"]
        if not actions:
            continue
        lines += [f"**{group.title}**", "", "| argument | meaning |", "|---|---|"]
        for a in actions:
            names = ", ".join(f"`{s}`" for s in a.option_strings) or f"`{a.metavar or a.dest}`"
            if a.choices and not isinstance(a, argparse._SubParsersAction):
                names += " {" + ", ".join(map(str, a.choices)) + "}"
            text = (a.help or "").replace("%%", "%")  # argparse's escape of a literal %
            lines.append(f"| {names} | {text.replace('|', '/')} |")
        lines.append("")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.stdout.write(render())
