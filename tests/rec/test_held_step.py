"""A checkpoint step being read (export, eval, --resume-from) is not pruned under its reader by the
training that goes on writing there; it is pruned once the reader lets go."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from rec.errors import InputError
from rec.train.checkpoint import prune
from rec.train.held_step import held_checkpoint
from rec.train.resume import INDEX_FILE, LATEST, step_dir, step_name
from tests.flows.going_on import going_on, write_next


def checkpoints(root: Path, *steps: int) -> Path:
    for step in steps:
        step_dir(root, step).mkdir(parents=True)
        (step_dir(root, step) / INDEX_FILE).write_bytes(b"index")
        (step_dir(root, step) / "__0_0.distcp").write_bytes(b"weights")
    (root / LATEST).write_text(step_name(steps[-1]))
    return root


def test_a_step_being_read_outlives_pruning_and_goes_at_the_pruning_after_its_reader(tmp_path):
    root = checkpoints(tmp_path / "c", 3)
    with held_checkpoint(root) as (directory, step):
        assert (directory, step) == (root, 3)
        for _ in range(3):
            write_next(root, keep=1)
        assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [step_name(3), step_name(6)]
        assert (step_dir(root, 3) / "__0_0.distcp").read_bytes() == b"weights"
    write_next(root, keep=1)
    assert sorted(p.name for p in root.iterdir() if p.is_dir()) == [step_name(7)]


def test_readers_of_a_directory_pruned_as_fast_as_it_is_written_always_hold_a_whole_step(tmp_path):
    """LATEST moves on and its step is pruned between a reader reading LATEST and holding the step:
    the reader looks again, and what it holds stays whole while it reads."""
    root = checkpoints(tmp_path / "c", 1)
    held = []
    with going_on(root, every_s=0.002) as written:
        while len(held) < 100 or len(written) < 20:
            with held_checkpoint(root) as (_, step):
                assert (step_dir(root, step) / INDEX_FILE).read_bytes() == b"index"
                time.sleep(0.002)  # reading: steps after it are written and pruned meanwhile
                assert (step_dir(root, step) / "__0_0.distcp").read_bytes() == b"weights"
                held.append(step)
    assert len(set(held)) > 3  # it read on as the training went on


def test_a_step_named_by_its_path_and_pruned_before_it_is_read_is_named_missing(tmp_path):
    root = checkpoints(tmp_path / "c", 1, 2)
    named = step_dir(root, 1)
    prune(root, keep=1)
    with pytest.raises(InputError) as refused:
        with held_checkpoint(named):
            pass
    assert [(p.where, p.reason) for p in refused.value.problems] == [(str(named), "no such directory")]
