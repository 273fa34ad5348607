"""The one exception type for user mistakes: it carries every problem found at once."""

from __future__ import annotations

import re
import reprlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TypeVar

T = TypeVar("T")

# The line of a traceback that states the error (``ModuleNotFoundError: No module named 'x'``): what
# another process's output says its failure was.
ERROR_LINE = re.compile(r"^[\w.]*(Error|Exception|Timeout)\b.*?: \S")
MAX_LINE = 300  # characters of one problem line: a user's 1 MB table name must not flood the screen
MAX_PROBLEMS_SHOWN = 30
MIN_WHERE = 60  # characters of a problem line's places kept however long its reason


@dataclass(frozen=True)
class Problem:
    """One thing wrong with a user's input: where (a table, a row, a key) and why."""

    where: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


class InputError(Exception):
    """Bad user input. The CLI prints it on one screen and exits 2."""

    def __init__(self, title: str, problems: list[Problem] | tuple[Problem, ...] = ()):
        self.title = title
        self.problems = tuple(problems)
        super().__init__(self.render())

    def render(self, limit: int = MAX_PROBLEMS_SHOWN) -> str:
        """The title and up to ``limit`` lines of problems (and one saying how many more), safe to
        print on a terminal.

        Problems with the same reason share a line ("table 'a', table 'b' and 998 more: ..."), so
        a thousand tables with one mistake fit on one screen.
        """
        groups: dict[str, list[str]] = {}
        for p in self.problems:
            groups.setdefault(p.reason, []).append(p.where)
        lines = [printable(self.title)]
        shown = 0
        for reason, wheres in groups.items():
            group = _group_lines(reason, wheres)
            if shown and len(lines) - 1 + len(group) > limit:  # long places take a line each
                break
            lines += group
            shown += len(wheres)
        if shown < len(self.problems):
            lines.append(f"  ... and {len(self.problems) - shown} more problems")
        return "\n".join(lines)


def _group_lines(reason: str, wheres: list[str]) -> list[str]:
    """The lines of the problems of one reason: the places on one line (the first 3 of them and how
    many more), each place whole where the line can hold it; up to 3 places too long for one line
    share the reason, each on its line, rather than one of them cut."""
    def width(more: str) -> int:
        return max(MAX_LINE - len(reason) - len(more) - 2, MIN_WHERE)

    first = wheres[:3]
    if len(wheres) <= 3 and len(first) > 1 and len(", ".join(first)) > width(""):
        return [line for where in first for line in _group_lines(reason, [where])]
    fits = len(first)
    while fits > 1 and len(", ".join(first[:fits])) > width(f" and {len(wheres) - fits + 1} more"):
        fits -= 1
    more = f" and {len(wheres) - fits} more" if len(wheres) > fits else ""
    # long paths are cut before the reason is: the line must still say why
    where = printable(", ".join(first[:fits]), width(more))
    return [f"  - {printable(where + more + ': ' + reason)}"]


class Collected:
    """Runs checks of several inputs, each to its end, keeping their InputErrors, so that one error
    names the problems of them all (``all_of``)."""

    def __init__(self) -> None:
        self.errors: list[InputError] = []

    def run(self, check: Callable[[], T]) -> T | None:
        """``check()``, or None where it raised an InputError (kept)."""
        try:
            return check()
        except InputError as e:
            self.errors.append(e)
            return None

    def raise_if_any(self) -> None:
        if self.errors:
            raise all_of(self.errors)


def all_of(errors: Sequence[InputError], title: str = "Invalid input:") -> InputError:
    """One InputError naming the problems of every one of ``errors`` (several inputs checked apart, e.g.
    the settings, the spec and the topology), so that one run names them all; one alone as it is."""
    if len(errors) == 1 or any(not e.problems for e in errors):
        return next((e for e in errors if not e.problems), errors[0])
    return InputError(title, [p for e in errors for p in e.problems])


def printable(text: str, limit: int = MAX_LINE) -> str:
    """``text`` cut to ``limit`` characters, with control characters (newlines, terminal escapes) escaped."""
    if len(text) > limit:
        text = text[: limit - 3] + "..."
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)


def show(value: object, limit: int = 60) -> str:
    """A user's value for a message: its repr, cut to ``limit`` characters (bounded work for any value)."""
    text = _REPR.repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


_REPR = reprlib.Repr()  # reprlib stops at a depth and length, so a huge or deeply nested value is cheap
_REPR.maxlevel, _REPR.maxstring, _REPR.maxlong, _REPR.maxother = 3, 70, 40, 70


class ProblemList:
    """Collects problems while validating, then raises them all together."""

    def __init__(self) -> None:
        self.items: list[Problem] = []

    def add(self, where: str, reason: str) -> None:
        self.items.append(Problem(where, reason))

    def raise_if_any(self, title: str) -> None:
        if self.items:
            raise InputError(title, self.items)

    def __bool__(self) -> bool:
        return bool(self.items)
