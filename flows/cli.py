"""The ``shardflow`` command line: builds the parser from ``flows.commands`` and runs one command.

To add a subcommand, write ``flows/commands/NAME.py`` with ``add_parser(subparsers)`` and list the
module in ``COMMANDS``. Every command takes ``-v/--verbose`` (the libraries' own output, see
``flows.logs``); long work shows progress on stderr (``flows.progress``).
"""

from __future__ import annotations

import argparse
import contextlib
import difflib
import errno
import io
import os
import re
import signal
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from flows.commands import (
    calibrate,
    compare,
    data,
    evaluate,
    export,
    measure,
    outbox,
    plan,
    predict,
    replan,
    run,
    serve,
    show,
    spec,
    train,
    ui,
)
from rec.disk_full import DISK_FULL_ERRNOS, DiskFull
from rec.errors import InputError, Problem
from rec.errors import show as shown
from rec.exit_codes import ExitCode, stopped_by
from rec.stop_signals import Stopped, signals_stop

COMMANDS = (data, spec, plan, show, train, evaluate, export, predict, measure, calibrate, run, replan, compare,
            outbox, serve, ui)


class CommandParser(argparse.ArgumentParser):
    """The parser of ``shardflow`` and of each of its commands (``add_subparsers`` makes its
    subparsers of the same class): no abbreviations (``--iteration`` is not ``--iterations``), and an
    unknown flag is the error reported first, by the command it was given to, with that command's
    usage and the flag it most likely meant."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["allow_abbrev"] = False
        super().__init__(*args, **kwargs)
        self._parsing: list[str] = []

    def parse_known_args(self, args: Sequence[str] | None = None,  # type: ignore[override]
                         namespace: argparse.Namespace | None = None) -> tuple[argparse.Namespace, list[str]]:
        self._parsing = list(sys.argv[1:] if args is None else args)
        parsed, extras = super().parse_known_args(self._parsing, namespace)
        if extras:  # here, not in the top-level parser: the usage shown is this command's
            self.error(self._unrecognized(extras))
        return parsed, extras

    def error(self, message: str) -> NoReturn:
        unknown = self._unknown_flags()
        if unknown and not message.startswith("unrecognized arguments"):
            message = self._unrecognized(unknown)  # before "--topology is required" and the like
        mistyped = re.match(r"argument COMMAND: invalid choice: '(.*?)' ", message)
        close = difflib.get_close_matches(mistyped.group(1), self._commands(), n=1) if mistyped else []
        if close:
            message += f"; did you mean {close[0]}?"
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")

    def _unknown_flags(self) -> list[str]:
        """The flags among the arguments being parsed that this parser does not know (up to its
        own subcommand's name, whose flags are that subcommand's)."""
        commands = set(self._commands())
        unknown = []
        for arg in self._parsing:
            if arg == "--" or arg in commands:
                break
            if len(arg) < 2 or arg[0] not in self.prefix_chars or self._negative_number_matcher.match(arg):
                if commands:  # the command's place (its flags take no value): a mistyped command, not their flags
                    break
                continue
            name = arg.split("=", 1)[0]
            if name not in self._option_string_actions and arg[:2] not in self._option_string_actions:
                unknown.append(name)
        return unknown

    def _commands(self) -> list[str]:
        """The names of this parser's subcommands (none for a command's own parser)."""
        return [name for action in self._actions if isinstance(action, argparse._SubParsersAction)
                for name in action.choices]

    def _unrecognized(self, extras: list[str]) -> str:
        known = [o for o in self._option_string_actions if o.startswith("--")]
        shown = []
        for arg in extras:
            name = arg.split("=", 1)[0]
            close = difflib.get_close_matches(name, known, n=1) if name.startswith("-") else []
            shown.append(f"{arg} (did you mean {close[0]}?)" if close else arg)
        return "unrecognized arguments: " + " ".join(shown)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subparser per module in ``COMMANDS``."""
    parser: argparse.ArgumentParser = CommandParser(
        prog="shardflow", description="Plan how embedding tables are sharded across GPUs, and train with the plan."
    )
    verbose: dict[str, Any] = {"action": "store_true", "help": "show what Prefect, MLflow, torchrun and warnings print"}
    parser.add_argument("-v", "--verbose", **verbose)
    subparsers = parser.add_subparsers(title="commands", metavar="COMMAND", required=True)
    for command in COMMANDS:
        command.add_parser(subparsers)
    _add_to_commands(subparsers, verbose)
    return parser


def _add_to_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
                     verbose: dict[str, Any]) -> None:
    """``-v`` after the command too (``shardflow run ... -v``, ``shardflow spec show ... -v``)."""
    for sub in subparsers.choices.values():
        sub.add_argument("-v", "--verbose", **verbose, default=argparse.SUPPRESS)
        for action in sub._actions:
            if isinstance(action, argparse._SubParsersAction):
                _add_to_commands(action, verbose)


# Options naming a path, where an empty value ("--out $OUT" with OUT unset) is a mistake.
PATH_ARGUMENTS = frozenset({"out", "topology", "plan", "data", "eval_data", "model", "profile", "previous",
                            "checkpoint", "checkpoint_dir", "resume_from", "state_dir"})


def paths_not_utf8(values: dict[str, Any]) -> list[Problem]:
    """The paths among a command's ``values`` (and the working directory, which the default paths are in)
    that are not UTF-8 text: a file name of other bytes, or any non-ASCII one where Python decodes names as
    ASCII (a C locale with PYTHONUTF8=0). Arrow writes paths as UTF-8: such a plan failed with a traceback
    after its search, leaving an empty folder."""
    named = {f"--{name.replace('_', '-')}": value for name, value in values.items() if name in PATH_ARGUMENTS}
    with contextlib.suppress(OSError):  # a working directory removed meanwhile: refused where it is used
        named["the working directory"] = os.getcwd()
    named["SPEC"] = values.get("spec")
    problems = []
    for where, value in named.items():
        if isinstance(value, str) and not _utf8(value):
            problems.append(Problem(where, f"{ascii(value)[1:-1]} is not UTF-8 text: rename it, or run in a UTF-8 "
                                           "locale (LANG=C.UTF-8, or PYTHONUTF8=1)"))
    return problems


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # undecodable bytes, kept as surrogates
        return False
    return True


MIN_OPEN_FILES = 64  # a training of 2 ranks with Prefect, MLflow and Ray's clients needs about as many
WANTED_OPEN_FILES = 65536


def enough_open_files() -> None:
    """Raise this process's open-files limit (``ulimit -n``, which the processes it starts inherit) to its
    hard limit; InputError where even that is below ``MIN_OPEN_FILES``: below it a training failed late
    in torchrun, and Prefect's server spun on "too many open files", writing 800 MB of errors in 2 minutes."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = WANTED_OPEN_FILES if hard == resource.RLIM_INFINITY else min(hard, WANTED_OPEN_FILES)
    if soft != resource.RLIM_INFINITY and soft < wanted:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    if soft != resource.RLIM_INFINITY and soft < MIN_OPEN_FILES:
        raise InputError("Too few open files allowed:", [Problem("ulimit -n", (
            f"{soft} (hard limit {hard}): shardflow needs at least {MIN_OPEN_FILES}; raise it (ulimit -n 1024)"))])


# OS errors of a path that are the machine's fault, not a mistake in the path (exit 1, not 2).
MACHINE_FAULTS = DISK_FULL_ERRNOS | {errno.EIO}


def printable_anywhere() -> None:
    """Output the terminal's encoding cannot show (``LC_ALL=C``, ``PYTHONIOENCODING=ascii``: a table's
    name, a dash in a message) is replaced, not raised: a UnicodeEncodeError once failed commands whose
    work had succeeded, at their summary."""
    for stream in (sys.stdout, sys.stderr):
        if isinstance(stream, io.TextIOWrapper) and stream.errors == "strict":
            stream.reconfigure(errors="replace")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``shardflow`` with ``argv``; returns the exit code (2 for any user mistake)."""
    printable_anywhere()
    try:
        args = build_parser().parse_args(argv)
        empty = sorted(f"--{name.replace('_', '-')}" for name, value in vars(args).items()
                       if value == "" and name in PATH_ARGUMENTS)
        if empty:  # an unset shell variable: "" would name the working directory
            raise InputError("Empty paths:", [Problem(flag, "is empty: name a file or directory") for flag in empty])
        not_utf8 = paths_not_utf8(vars(args))
        if not_utf8:
            raise InputError("Paths that are not UTF-8 text:", not_utf8)
        enough_open_files()
        from flows.logs import set_up

        set_up(args.verbose)
        # A command that writes files stops on SIGTERM and SIGHUP as on Ctrl-C: its partial files removed
        stopping = signals_stop() if getattr(args, "signals_stop", False) else contextlib.nullcontext()
        with stopping:
            code: int = args.handler(args)
        return code
    except SystemExit as e:  # argparse: usage errors exit 2, --help exits 0
        if e.code is None or isinstance(e.code, int):
            return e.code or ExitCode.OK
        print(f"shardflow: {e.code}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except InputError as e:
        print(f"shardflow: {e.render()}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except BrokenPipeError:
        # The reader went away (`| head`): stop quietly; Python would complain again at exit
        # while flushing stdout, so point stdout at nothing first.
        try:
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        except (OSError, ValueError):  # stdout is no file (a test's StringIO)
            pass
        return ExitCode.BROKEN_PIPE
    except ValueError as e:
        problems = _settings_problems(e)
        if not problems:
            raise
        error = InputError("Prefect cannot read its settings (environment or profile):", problems)
        print(f"shardflow: {error.render()}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except DiskFull as e:
        print(f"shardflow: {e}", file=sys.stderr)
        return ExitCode.FAILED
    except OSError as e:
        if e.filename is None:
            raise
        if e.errno in MACHINE_FAULTS:  # the disk's doing, not the path's: another disk, or later, may do
            print(f"shardflow: cannot use {e.filename}: {os.strerror(e.errno)}", file=sys.stderr)
            return ExitCode.FAILED
        print(f"shardflow: cannot use {e.filename}: {e.strerror or e}", file=sys.stderr)
        return ExitCode.BAD_INPUT
    except Stopped as e:
        if e.signum == signal.SIGINT:
            print("shardflow: interrupted", file=sys.stderr)
            return ExitCode.INTERRUPTED
        print(f"shardflow: stopped by {e.name}; nothing half written is left", file=sys.stderr)
        return stopped_by(e.signum)
    except KeyboardInterrupt:
        print("shardflow: interrupted", file=sys.stderr)
        return ExitCode.INTERRUPTED


def _settings_problems(e: ValueError) -> list[Problem]:
    """A pydantic ValidationError of Prefect's settings (an environment variable such as
    PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=abc fails ``import prefect``), one problem per
    value; nothing for any other error."""
    title = str(getattr(e, "title", ""))
    errors = getattr(e, "errors", None)
    if type(e).__name__ != "ValidationError" or not title.endswith("Settings") or not callable(errors):
        return []
    return [Problem(f"{title}.{'.'.join(map(str, error.get('loc', ())))}",
                    f"{error.get('msg', 'invalid')}, got {shown(error.get('input'))}") for error in errors()]


if __name__ == "__main__":
    sys.exit(main())
