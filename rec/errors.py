"""The one exception type for user mistakes: it carries every problem found at once."""

from __future__ import annotations

from dataclasses import dataclass


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

    def render(self, limit: int = 30) -> str:
        lines = [self.title]
        shown = self.problems[:limit]
        lines += [f"  - {p}" for p in shown]
        if len(self.problems) > limit:
            lines.append(f"  ... and {len(self.problems) - limit} more problems")
        return "\n".join(lines)


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
