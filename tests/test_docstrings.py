"""Docstrings say what the code does and why: no measured timings (they go stale; they belong in
bench/RESULTS.md and docs/) and no history (it belongs in commit messages)."""

from __future__ import annotations

import ast
import re

from tests.paths import ROOT

PACKAGES = ("rec", "tasks", "flows")
# A duration: a number and a unit of time.
TIMING = re.compile(r"(?<![\w.])\d+(?:[.,]\d+)?(?:\s?-\s?\d+(?:[.,]\d+)?)?\s?"
                    r"(?:ms|s|seconds?|minutes?|min|µs|us|hours?)\b")
# Durations that are settings or rules, not measurements: a default, a timeout, a limit, a schedule.
SETTING = re.compile(r"default|timeout|limit|at most|at least|budget|every|poll|unless set|per byte|below|above|"
                     r"threshold|waits?|after|within|older than", re.I)
HISTORY = re.compile(r"\b(?:once printed|no longer (?:imports|prints|reads|uses)|used to|previously|formerly|"
                     r"before this change|the old (?:code|version))\b", re.I)


def _docstrings() -> list[tuple[str, str]]:
    found = []
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                    text = ast.get_docstring(node, clean=False)
                    if text:
                        where = f"{path.relative_to(ROOT)}:{getattr(node, 'lineno', 1)}"
                        found.append((where, text))
    return found


def _prose(text: str) -> str:
    """The docstring without its ``code`` spans and indented examples (output shown, not measured)."""
    text = re.sub(r"``[^`]*``", "", text)
    return "\n".join(line for line in text.splitlines() if not line.startswith("    "))


def test_no_docstring_holds_a_measured_timing_or_history():
    problems = []
    for where, text in _docstrings():
        prose = _prose(text)
        for m in TIMING.finditer(prose):
            before = prose[max(0, m.start() - 60):m.start()]
            if not SETTING.search(before + prose[m.end():m.end() + 30]):
                problems.append(f"{where}: timing {m.group(0)!r} ({' '.join(before.split()[-6:])} ...)")
        problems += [f"{where}: history {m.group(0)!r}" for m in HISTORY.finditer(prose)]
    assert not problems, "docstrings with figures or history (move them to bench/RESULTS.md, docs/ or the " \
                         "commit message):\n" + "\n".join(problems)


def test_the_guard_finds_what_it_guards_against():
    assert TIMING.search("an H100: naive 21.7 ms, sparse_dist 23.5 ms") and TIMING.search("5-6 s of CPU")
    assert HISTORY.search("``shardflow plan`` once printed the critical path alone")
    assert not TIMING.search(_prose("prints ``ingest 0.06 s, total 22.1 s``"))
