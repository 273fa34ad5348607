"""When a Prefect task is worth retrying: a user's mistake fails the same way every time."""

from __future__ import annotations

from typing import Any

from rec.errors import InputError


def unless_input_error(task: Any, task_run: Any, state: Any) -> bool:
    """``retry_condition_fn``: retry anything but an InputError (a bad spec, a plan that cannot
    fit, a world size that does not match). Prefect hands the exception over as the state's data."""
    return not isinstance(getattr(state, "data", None), InputError)
