"""The part cache: a finished part kept by its part key, linked (not copied) into a later
run's folder, and pruned once nothing else links its files."""

from __future__ import annotations

import os

from studio.core.partcache import ROW, PartCache, files_digest


def test_a_kept_part_is_linked_back_and_pruned_when_alone(tmp_path):
    cache = PartCache(tmp_path / "parts")
    part = tmp_path / "run1" / "part1_of_2"
    part.mkdir(parents=True)
    (part / "decode.onnx").write_bytes(b"graph")
    (part / "weights.data").write_bytes(b"w" * 5000)
    (part / ".part-done.json").write_text("{}")  # a mark: not part of the content
    key = cache.key("quantize-part", graphs=files_digest(part), recipe={"scheme": "W8A16"})
    assert key != cache.key("quantize-part", graphs=files_digest(part), recipe={"scheme": "W4A16"})
    assert cache.get(key, tmp_path / "nowhere") is None and not (tmp_path / "nowhere").exists()
    cache.put(key, part, {"check": {"decode": 0.999}})

    again = tmp_path / "run2" / "part1_of_2"
    row = cache.get(key, again)
    assert row == {"check": {"decode": 0.999}}
    assert sorted(p.name for p in again.iterdir()) == ["decode.onnx", "weights.data"]
    assert (again / "weights.data").stat().st_ino == (part / "weights.data").stat().st_ino

    assert cache.prune() == 0  # still linked from the two runs
    for run in ("run1", "run2"):
        for p in (tmp_path / run / "part1_of_2").iterdir():
            p.unlink()
    assert cache.prune() == 1  # its artifacts are gone: so is the entry
    assert cache.get(key, again) is None


def test_a_damaged_entry_is_computed_again(tmp_path):
    cache = PartCache(tmp_path / "parts")
    part = tmp_path / "p"
    part.mkdir()
    (part / "a.onnx").write_bytes(b"12345")
    cache.put("ab" * 32, part, {})
    entry = tmp_path / "parts" / "ab" / ("ab" * 32)
    assert (entry / ROW).is_file()
    os.unlink(entry / "a.onnx")
    (entry / "a.onnx").write_bytes(b"1")  # truncated
    assert cache.get("ab" * 32, tmp_path / "q") is None


def test_no_root_keeps_nothing(tmp_path):
    cache = PartCache(None)
    part = tmp_path / "p"
    part.mkdir()
    (part / "a.onnx").write_bytes(b"x")
    cache.put("cd" * 32, part, {})
    assert cache.get("cd" * 32, tmp_path / "q") is None and cache.prune() == 0
