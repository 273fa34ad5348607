"""Why a training failed, as the launcher tells it from its ranks' error records: each rank reads its
own share of the data, so the bad input each found is named at once, not one run at a time."""

from __future__ import annotations

from rec.errors import InputError, Problem
from rec.train.rank_log import RankOutput
from tasks.launch import Finished, Launch, failure_cause


def bad_data(*problems: str) -> InputError:
    return InputError("The training data cannot be used:",
                      [Problem(f"--data column {p!r}", f"{p} bad") for p in problems])


def test_the_bad_input_of_every_rank_is_named_not_only_the_first_ranks(tmp_path):
    RankOutput(str(tmp_path), rank=1, local_rank=1).failed(bad_data("label", "cat_2"))
    RankOutput(str(tmp_path), rank=0, local_rank=0).failed(bad_data("dense"))
    RankOutput(str(tmp_path), rank=2, local_rank=2).failed(RuntimeError("Connection closed by peer"))
    cause = failure_cause(Launch("plan.json", str(tmp_path), 3), Finished(1))
    assert cause.deterministic
    assert cause.text.startswith("rank 1: InputError: The training data cannot be used: --data column 'label': "
                                 "label bad")
    assert cause.text.endswith("(and rank 0's own bad input, below) (then 1 more rank failed)")
    assert cause.problems == ("--data column 'label': label bad", "--data column 'cat_2': cat_2 bad",
                              "rank 0: The training data cannot be used: --data column 'dense': dense bad")


def test_ranks_that_found_the_same_bad_input_are_named_once(tmp_path):
    for rank in (0, 1):
        RankOutput(str(tmp_path), rank=rank, local_rank=rank).failed(bad_data("dense"))
    cause = failure_cause(Launch("plan.json", str(tmp_path), 2), Finished(1))
    assert cause.text == "ranks 0-1: InputError: The training data cannot be used: --data column 'dense': dense bad"
    assert cause.problems == ()
