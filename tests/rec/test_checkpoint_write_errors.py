"""A checkpoint the OS will not write, for another reason than a full disk (an I/O error, a lost
network mount): the rank's error names the file and the OS's reason."""

from __future__ import annotations

import errno
import gc
from contextlib import contextmanager

import pytest
import torch
from torch.distributed.checkpoint.filesystem import FileSystem

from rec.train import checkpoint
from rec.train.ownership import Run
from rec.train.rank_log import one_line
from rec.train.resume import LATEST


class _FailingStream:
    """A file whose writes reach a device that fails: EIO, as a dying disk or a lost mount gives."""

    def __init__(self, stream):
        self._stream = stream

    def write(self, data):
        raise OSError(errno.EIO, "Input/output error")

    def __getattr__(self, name):
        return getattr(self._stream, name)


def test_a_checkpoint_file_the_os_fails_to_write_is_named_with_the_reason(tmp_path, monkeypatch,
                                                                          single_process_group):
    """The rank said only "CheckpointException on rank 0: RuntimeError: [enforce fail at
    inline_container.cc:...] . unexpected pos 64 vs 0": neither the file nor the reason."""
    opened = FileSystem.create_stream

    @contextmanager
    def failing(self, path, mode):
        with opened(self, path, mode) as stream:
            yield stream if "r" in mode else _FailingStream(stream)

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    checkpoint.save(tmp_path, 2, model, optimizer, keep=3, written_by=Run.new(tmp_path))
    monkeypatch.setattr(FileSystem, "create_stream", failing)
    with pytest.raises(checkpoint.CheckpointWriteFailed) as failed:
        checkpoint.save(tmp_path, 4, model, optimizer, keep=3, written_by=Run.new(tmp_path))
    cause = one_line(failed.value)
    assert cause.startswith(f"CheckpointWriteFailed: cannot write {tmp_path / 'step_00000004'}/")
    assert cause.endswith(".distcp: Input/output error"), cause
    assert (tmp_path / LATEST).read_text() == "step_00000002"  # the last whole checkpoint stays the one
    gc.collect()  # under torch 2.11 (the GPU image's) freeing what the failed write left crashed the process


def test_on_several_ranks_the_file_the_os_failed_to_write_is_the_cause_named(tmp_path):
    """A peer's DCP error ("unexpected pos"), reported first, was named instead of the write that failed."""
    from rec.train.rank_log import RankError
    from tasks.launch import Finished, Launch, failure_cause

    peer = RankError(1, "CheckpointException on ranks 0, 1: RuntimeError: [enforce fail at inline_container.cc:664] "
                        ". unexpected pos 64 vs 0", False, 1.0)
    failed = RankError(0, "CheckpointWriteFailed: cannot write /o/checkpoints/step_00000040/__0_0.distcp: "
                          "Input/output error", False, 2.0)
    cause = failure_cause(Launch("plan.json", str(tmp_path), 2), Finished(1, (peer, failed)))
    assert cause.text.startswith("rank 0: CheckpointWriteFailed: cannot write /o/checkpoints/step_00000040/")
