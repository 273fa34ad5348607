"""Reading files someone else wrote: no link followed, regular files only, never blocking, never more
than the limit. Real links, FIFOs, device files and sparse files."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest

from rec.safe_read import UnsafeFile, copy_file, folder, read_fd, read_file
from tests.deadline import deadline


@pytest.fixture
def root(tmp_path: Path) -> Iterator[int]:
    (tmp_path / "box").mkdir()
    with folder(tmp_path / "box") as fd:
        yield fd


def test_a_regular_file_below_the_folder_is_read(tmp_path, root):
    (tmp_path / "box" / "logs").mkdir()
    (tmp_path / "box" / "logs" / "rank-0.log").write_text("fine")
    assert read_file("logs/rank-0.log", root, 100) == b"fine"
    copy_file("logs/rank-0.log", root, 100, tmp_path / "copy")
    assert (tmp_path / "copy").read_text() == "fine"


def test_a_link_to_a_file_or_a_linked_folder_on_the_way_is_refused_not_followed(tmp_path, root):
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("secret")
    (tmp_path / "box" / "key").symlink_to(secret / "key")
    (tmp_path / "box" / "logs").symlink_to(secret, target_is_directory=True)
    for name in ("key", "logs/key"):
        with pytest.raises(UnsafeFile, match="is a symbolic link"):
            read_file(name, root, 100)
    with pytest.raises(UnsafeFile, match="is a symbolic link"):
        copy_file("logs/key", root, 100, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


@pytest.mark.parametrize("name", ["../secret", "/etc/passwd", "a//b", "./a", ""])
def test_a_name_that_leads_out_of_the_folder_is_refused(root, name):
    with pytest.raises(UnsafeFile, match="not a relative path inside"):
        read_file(name, root, 100)


def test_a_fifo_is_refused_without_blocking(tmp_path, root):
    os.mkfifo(tmp_path / "box" / "record.json")  # nobody writes: a blocking open would hang
    with deadline(10), pytest.raises(UnsafeFile, match="is a FIFO"):
        read_file("record.json", root, 100)


def test_a_device_is_never_opened(tmp_path, root):
    try:
        os.mknod(tmp_path / "box" / "zero", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers
    except PermissionError:
        pytest.skip("making a device file needs root")
    with deadline(10), pytest.raises(UnsafeFile, match="is a device"):
        read_file("zero", root, 1 << 20)


def test_a_file_bigger_than_the_limit_is_refused_before_it_is_read(tmp_path, root):
    with open(tmp_path / "box" / "huge", "wb") as f:
        f.truncate(1 << 40)  # 1 TiB, sparse: reading it whole would take hours
    with deadline(10), pytest.raises(UnsafeFile, match=r"is 1\.0 TiB, more than the 1\.0 MiB"):
        read_file("huge", root, 1 << 20)


def test_a_read_stops_at_the_limit_whatever_the_file_claims():
    fd = os.open("/dev/zero", os.O_RDONLY)  # endless, and claims size 0
    try:
        with deadline(10), pytest.raises(UnsafeFile, match=r"holds more than 1\.0 MiB"):
            read_fd(fd, 1 << 20, "zero")
    finally:
        os.close(fd)
    out, into = os.pipe()
    os.write(into, b"x" * 3000)
    os.close(into)
    try:
        with pytest.raises(UnsafeFile, match="holds more than 1000 B"):
            read_fd(out, 1000, "pipe")
        assert len(os.read(out, 10_000)) == 3000 - 1001  # it read the limit and one byte more, no further
    finally:
        os.close(out)


def test_a_link_as_the_folder_itself_is_refused(tmp_path):
    (tmp_path / "real").mkdir()
    (tmp_path / "entry").symlink_to(tmp_path / "real", target_is_directory=True)
    with pytest.raises(UnsafeFile, match="is a symbolic link"), folder(tmp_path / "entry"):
        pass
