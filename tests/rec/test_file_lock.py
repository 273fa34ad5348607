"""``rec.file_lock``: the one way shardflow takes a lock, and what it never follows."""

from __future__ import annotations

import os

import pytest

from rec.file_lock import file_lock, open_lock_file, release, take


def test_exclusive_and_shared_locks_exclude_each_other_as_flock_does(tmp_path):
    path = tmp_path / ".lock"
    with file_lock(path):
        with pytest.raises(BlockingIOError), file_lock(path, blocking=False):
            pass
        with pytest.raises(BlockingIOError), file_lock(path, shared=True, blocking=False):
            pass
    with file_lock(path, shared=True), file_lock(path, shared=True, blocking=False):
        with pytest.raises(BlockingIOError), file_lock(path, blocking=False):
            pass
    with file_lock(path, blocking=False):  # all let go
        pass


def test_a_removed_lock_is_gone_after_use_and_a_waiter_locks_the_file_then_at_its_path(tmp_path):
    import threading

    path = tmp_path / ".lock"
    held = threading.Event()
    order: list[str] = []

    def waiter() -> None:
        with file_lock(path, removed=True):  # waits for the holder, who removes the file it locked
            order.append("waiter")
            held.set()
            threading.Event().wait(0.3)

    with file_lock(path, removed=True):
        thread = threading.Thread(target=waiter)
        thread.start()
        threading.Event().wait(0.3)
        order.append("holder")
    assert held.wait(10)
    # the waiter holds the lock of the file now at the path: nobody else takes it meanwhile
    with pytest.raises(BlockingIOError), file_lock(path, removed=True, blocking=False):
        pass
    thread.join()
    assert order == ["holder", "waiter"]
    assert not path.exists()  # nothing left beside the files it guarded
    with file_lock(path, shared=True, removed=True), file_lock(path, shared=True, removed=True, blocking=False):
        pass


def test_a_held_lock_changes_kind_and_a_failed_take_leaves_no_descriptor_open(tmp_path):
    path = tmp_path / ".lock"
    fd = open_lock_file(path, write=True)
    try:
        take(fd)
        os.pwrite(fd, b"pid 1\n", 0)
        take(fd, shared=True)  # exclusive to shared: others may share it now
        with file_lock(path, shared=True, blocking=False):
            pass
        release(fd)
    finally:
        os.close(fd)
    assert path.read_text() == "pid 1\n"
    before = len(os.listdir("/proc/self/fd"))
    with file_lock(path), pytest.raises(BlockingIOError), file_lock(path, blocking=False):
        pass
    assert len(os.listdir("/proc/self/fd")) == before


@pytest.mark.parametrize("planted", ["link", "dangling link", "fifo", "directory"])
def test_what_stands_in_a_lock_files_place_is_moved_aside_never_followed(tmp_path, planted):
    victim = tmp_path / "victim.txt"
    victim.write_text("must stay as it is")
    owned = tmp_path / "owned"
    owned.mkdir()
    path = owned / ".lock"
    if planted == "link":
        path.symlink_to(victim)
    elif planted == "dangling link":
        path.symlink_to(tmp_path / "nothing-yet")
    elif planted == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()

    with file_lock(path) as fd:
        assert os.fstat(fd).st_ino == os.stat(path).st_ino  # a new regular file, this one
    assert path.is_file() and not path.is_symlink()
    (aside,) = [p for p in owned.iterdir() if p.name.startswith(".lock.not-a-file-")]
    assert aside.is_symlink() or aside.is_fifo() or aside.is_dir()
    assert victim.read_text() == "must stay as it is" and not (tmp_path / "nothing-yet").exists()
