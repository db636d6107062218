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
