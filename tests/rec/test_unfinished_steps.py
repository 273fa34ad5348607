"""A step directory that LATEST never named (its training stopped, failed or diverged before every
rank had written it and its data position) is not a checkpoint to export, evaluate or resume from."""

from __future__ import annotations

import pytest

from rec.errors import InputError
from rec.train.resume import INDEX_FILE, LATEST, checkpoint_at


def steps(root, *numbers):
    for n in numbers:
        (root / f"step_{n:08d}").mkdir(parents=True)
        (root / f"step_{n:08d}" / INDEX_FILE).write_bytes(b"")
    return root


def test_a_step_beyond_latest_is_refused_naming_the_step_latest_names(tmp_path):
    """A training that diverged at its checkpoint of iteration 50 left step_00000050 with its index:
    `shardflow export` wrote its NaN weights as a model, exit 0, and `predict` 50,000 NaN scores."""
    root = steps(tmp_path / "checkpoints", 20, 40, 50)
    (root / LATEST).write_text("step_00000040")
    assert checkpoint_at(root / "step_00000040") == (root, 40)
    assert checkpoint_at(root / "step_00000020") == (root, 20)  # an earlier, whole one: LATEST moved past it
    with pytest.raises(InputError) as refused:
        checkpoint_at(root / "step_00000050")
    assert refused.value.problems[0].where == str(root / "step_00000050")
    assert refused.value.problems[0].reason == (
        "is not complete: LATEST names step_00000040, an earlier one (its training stopped, failed or diverged "
        f"before completing this one, or is writing it now); use {root} (its LATEST) or an earlier step")
    (root / LATEST).unlink()
    with pytest.raises(InputError, match="has no LATEST beside it") as refused:
        checkpoint_at(root / "step_00000020")
    assert refused.value.problems[0].reason.endswith("or the step was copied without LATEST; copy LATEST with it")
