"""When a Prefect task is worth retrying: a user's mistake, or a machine that lacks what the plan
needs, fails the same way every time."""

from __future__ import annotations

from typing import Any

from rec.errors import InputError


def worth_retrying(task: Any, task_run: Any, state: Any) -> bool:
    """``retry_condition_fn``: retry anything but an InputError (a bad spec, a plan that cannot
    fit, a world size that does not match, a cuda plan without CUDA), a failure the ranks
    reported as deterministic (``TrainingFailed.deterministic``), or an output that could not be
    written for a full disk (``TrainingFailed.disk_full``: the retry seconds later finds it as full).
    Prefect hands the exception over as the state's data."""
    error = getattr(state, "data", None)
    return not (isinstance(error, InputError) or getattr(error, "deterministic", False)
                or getattr(error, "disk_full", False))
