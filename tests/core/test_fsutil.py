"""Folders written whole or not at all: the body fills a temporary folder beside the target;
the target changes only when the body returns, and an older target survives a failure."""

from __future__ import annotations

import pytest

from studio.core.fsutil import atomic_copytree, atomic_folder


def test_a_folder_appears_whole_and_replaces_the_old_one(tmp_path):
    dest = tmp_path / "out"
    with atomic_folder(dest) as tmp:
        (tmp / "a.txt").write_text("one")
        assert not dest.exists()  # nothing there until the body returns
    assert (dest / "a.txt").read_text() == "one"
    with atomic_folder(dest) as tmp:
        (tmp / "b.txt").write_text("two")
        assert (dest / "a.txt").read_text() == "one"  # the old one stays meanwhile
    assert sorted(p.name for p in dest.iterdir()) == ["b.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # no temporary folders left


def test_a_failure_leaves_the_old_folder_as_it_was(tmp_path):
    dest = tmp_path / "out"
    dest.mkdir()
    (dest / "keep.txt").write_text("mine")
    with pytest.raises(RuntimeError), atomic_folder(dest) as tmp:
        (tmp / "half.txt").write_text("half-written")
        raise RuntimeError("cancelled")
    assert [p.name for p in dest.iterdir()] == ["keep.txt"]
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


def test_copytree_goes_through_the_same_swap(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "x.bin").write_bytes(b"\x00\x01")
    dest = atomic_copytree(src, tmp_path / "copy")
    assert (dest / "sub" / "x.bin").read_bytes() == b"\x00\x01"


# ---- what a writer may replace: check_output ---------------------------------------------------
import os  # noqa: E402
import socket  # noqa: E402
from pathlib import Path  # noqa: E402

from studio.core.errors import StudioError  # noqa: E402
from studio.core.fsutil import (  # noqa: E402
    atomic_write_bytes,
    atomic_write_text,
    check_destination,
    check_output,
    read_input,
)


def _no_temporaries(folder: Path) -> None:
    assert not [p.name for p in folder.iterdir() if p.name.startswith(".")]


def test_a_missing_path_and_a_regular_file_are_written(tmp_path):
    new = tmp_path / "sub" / "new.txt"
    atomic_write_text(new, "one")
    assert new.read_text() == "one"
    atomic_write_text(new, "two")  # a regular file: replaced
    assert new.read_text() == "two"
    _no_temporaries(new.parent)


def test_a_link_is_refused_and_left_as_it_was(tmp_path):
    target = tmp_path / "theirs.txt"
    target.write_text("someone else's")
    link = tmp_path / "out.txt"
    link.symlink_to(target)
    with pytest.raises(StudioError, match="is a symbolic link, not a regular file"):
        atomic_write_text(link, "report")
    assert link.is_symlink() and target.read_text() == "someone else's"
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "nowhere")
    with pytest.raises(StudioError, match="symbolic link"):
        atomic_write_bytes(dangling, b"x")
    assert dangling.is_symlink() and not (tmp_path / "nowhere").exists()
    _no_temporaries(tmp_path)


def test_a_fifo_is_refused_without_blocking(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    with pytest.raises(StudioError, match=r"is a named pipe \(FIFO\), not a regular file"):
        atomic_write_text(fifo, "report")
    assert fifo.is_fifo()
    _no_temporaries(tmp_path)


def test_a_device_is_refused():
    # /dev/null is only looked at: the refusal comes before any temporary file is made
    with pytest.raises(StudioError, match="is a character device, not a regular file"):
        check_output(Path("/dev/null"))
    with pytest.raises(StudioError, match="character device"):
        check_output(Path("/dev/null"), folder=True)


def test_a_socket_is_refused(tmp_path):
    path = tmp_path / "s.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(path))
        with pytest.raises(StudioError, match="is a socket"):
            atomic_write_text(path, "x")
    assert path.exists() and not path.is_file()


def test_a_file_where_a_folder_is_expected_and_the_other_way_round(tmp_path):
    f = tmp_path / "a-file"
    f.write_text("keep")
    with pytest.raises(StudioError, match="is a file, not a folder: give a folder"), \
            atomic_folder(f):
        pass
    assert f.read_text() == "keep"
    with pytest.raises(StudioError, match="is a folder: give a file name"):
        atomic_write_text(tmp_path, "x")
    with pytest.raises(StudioError, match="a folder on its path is a file"):
        check_output(f / "inside.txt")


def test_a_users_path_needs_its_folder_and_none_is_made(tmp_path):
    """The one rule for every writer of a path a user gives (check_destination): the folder
    it goes in must exist, for a file and for a folder alike; nothing is created."""
    for folder in (False, True):
        with pytest.raises(StudioError, match=r"the folder .*missing does not exist: create it "
                                              "first"):
            check_destination(tmp_path / "missing" / "out", folder=folder)
    assert list(tmp_path.iterdir()) == []
    assert check_destination(tmp_path / "out.md") == tmp_path / "out.md"
    f = tmp_path / "a-file"
    f.write_text("keep")
    with pytest.raises(StudioError, match="a folder on its path is a file"):
        check_destination(f / "out.md")
    with pytest.raises(StudioError, match="is a file, not a folder"):
        check_destination(f, folder=True)


def test_a_linked_folder_is_not_replaced(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "theirs.txt").write_text("keep")
    link = tmp_path / "link"
    link.symlink_to(real, target_is_directory=True)
    with pytest.raises(StudioError, match="symbolic link"), atomic_folder(link) as tmp:
        (tmp / "x").write_text("x")
    assert link.is_symlink() and (real / "theirs.txt").read_text() == "keep"


def test_a_folder_of_other_files_is_replaced_only_when_it_is_the_writers_own(tmp_path):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "photo.jpg").write_bytes(b"\xff")
    with pytest.raises(StudioError, match="holds other files"):
        check_output(theirs, folder=True, marker="manifest.json")
    (tmp_path / "empty").mkdir()
    check_output(tmp_path / "empty", folder=True, marker="")
    (theirs / "manifest.json").write_text("{}")
    check_output(theirs, folder=True, marker="manifest.json")


# ---- what a reader takes: read_input ------------------------------------------------------------
def test_read_input_takes_a_regular_file_and_a_link_to_one(tmp_path):
    f = tmp_path / "p.qstudio"
    f.write_bytes(b"abc")
    link = tmp_path / "link.qstudio"
    link.symlink_to(f)
    assert read_input(f, 10) == read_input(link, 10) == b"abc"
    with pytest.raises(StudioError, match="is 3 bytes; at most 2 are read"):
        read_input(f, 2)


def test_read_input_refuses_devices_fifos_and_folders_at_once(tmp_path):
    zero = tmp_path / "zero.qstudio"
    zero.symlink_to("/dev/zero")
    with pytest.raises(StudioError, match="is a character device, not a regular file"):
        read_input(zero, 1 << 20)
    fifo = tmp_path / "fifo.qstudio"
    os.mkfifo(fifo)  # nobody writes: a blocking open would hang here
    with pytest.raises(StudioError, match=r"named pipe \(FIFO\)"):
        read_input(fifo, 1 << 20)
    with pytest.raises(StudioError, match="is a folder"):
        read_input(tmp_path, 1 << 20)
    with pytest.raises(StudioError, match="does not exist"):
        read_input(tmp_path / "nope", 1 << 20)
