"""A rank's failure record (``rec.train.rank_log``): bad input the ranks find reaches the user whole.
The cause is one line (an MLflow tag, the failure line); every problem follows it where there are
several, or where the one was too long for the line."""

from __future__ import annotations

import json

from rec.errors import InputError, Problem
from rec.train.rank_log import MAX_CAUSE, RankError, _parse, _record, one_line, problem_lines


def test_the_cause_counts_the_problems_and_every_one_is_kept_where_the_line_cannot_hold_them():
    two = InputError("The training data cannot be used:", [Problem("--data column 'label'", "1 label not 0 or 1"),
                                                             Problem("--data column 'cat_2'", "1 id outside [0, 10)")])
    assert one_line(two) == ("InputError: The training data cannot be used: --data column 'label': 1 label not 0 "
                             "or 1 (and 1 more problem)")
    assert problem_lines(two) == ("--data column 'label': 1 label not 0 or 1",
                                  "--data column 'cat_2': 1 id outside [0, 10)")
    short = InputError("Cannot resume:", [Problem("step_10", "holds another model")])
    assert problem_lines(short) == ()  # the cause says it all
    long = InputError("Cannot resume:", [Problem("step_10", "holds another model " + "x" * MAX_CAUSE)])
    assert len(one_line(long)) == MAX_CAUSE and one_line(long).endswith("...")
    assert problem_lines(long) == (f"step_10: holds another model {'x' * MAX_CAUSE}"[:297] + "...",)
    assert problem_lines(RuntimeError("boom")) == ()


def test_a_record_keeps_its_problems_and_one_written_before_them_reads_without():
    record = RankError(1, "InputError: x (and 1 more problem)", True, 12.5, False, ("a: one", "b: two"))
    assert _parse(_record(record)) == record
    older = json.dumps({"rank": 0, "cause": "ValueError: boom", "deterministic": False, "time": 1.0})
    assert _parse(older) == RankError(0, "ValueError: boom", False, 1.0)
    odd = json.dumps({"rank": 0, "cause": "c", "deterministic": True, "time": 1.0, "problems": ["\x1b[31mred"]})
    assert _parse(odd).problems == ("\\x1b[31mred",)  # a record read back is printed: no terminal escapes
