"""A rank's failure record (``rec.train.rank_log``): bad input the ranks find reaches the user whole.
The cause is one line (an MLflow tag, the failure line); every problem follows it where there are
several, or where the one was too long for the line."""

from __future__ import annotations

import importlib.util
import json

import pytest

from rec.errors import InputError, Problem
from rec.train.rank_log import MAX_CAUSE, RankError, _parse, _record, one_line, problem_lines
from rec.train.user_model import user_code_exits_fail, users_frame
from rec.validation import positive_integer


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


USERS_CODE = """import json


def read(line):
    return json.loads(line)


def forward():
    raise ValueError('the tower widths differ')


def loud(n):
    raise ValueError('x' * n)
"""


def test_an_exception_of_the_users_code_names_its_file_line_and_target_and_stays_what_it_was(tmp_path):
    """``--model TARGET``: a user's forward or batches that raise fail the rank with the cause line
    ending where in the user's code it came from (through a library it called, too); an error of
    shardflow's own code in the same block gets no such note."""
    path = tmp_path / "mine.py"
    path.write_text(USERS_CODE)
    spec = importlib.util.spec_from_file_location("mine", path)
    mine = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mine)
    target = f"{path}:build"
    with pytest.raises(ValueError) as raised, user_code_exits_fail(target):
        mine.forward()
    assert one_line(raised.value) == f"ValueError: the tower widths differ (raised at line 9 (forward) of {target})"
    with pytest.raises(json.JSONDecodeError) as raised, user_code_exits_fail(target):
        mine.read("{")  # raised in Python's json: the user's line that called it
    assert one_line(raised.value).endswith(f"(raised at line 5 (read) of {target})")
    with pytest.raises(ValueError) as raised, user_code_exits_fail("models.shop:build"):  # a module's target
        mine.forward()
    assert one_line(raised.value).endswith(f"(raised at {path}:9 (forward), in the code of models.shop:build)")
    with pytest.raises(ValueError) as raised:
        positive_integer(-1)
    assert users_frame(raised.value.__traceback__.tb_next) is None  # shardflow's own code (this test's frame left out)
    with pytest.raises(ValueError) as raised, user_code_exits_fail(target):
        mine.loud(2 * MAX_CAUSE)  # the message is cut, not where it came from
    assert len(one_line(raised.value)) <= MAX_CAUSE and one_line(raised.value).endswith(f"(loud) of {target})")
