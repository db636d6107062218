from studio.core.artifacts import ArtifactStore, artifact_key


def test_commit_get_verify_and_keys(tmp_path):
    store = ArtifactStore(tmp_path / "a").open()
    key = artifact_key("export", {"p": 1}, {}, {"torch": "x"})
    assert key != artifact_key("export", {"p": 2}, {}, {"torch": "x"})
    assert key != artifact_key("export", {"p": 1}, {}, {"torch": "y"})
    assert store.get(key) is None
    wd = store.new_workdir()
    (wd / "model.onnx").write_bytes(b"abc")
    (wd / "sub").mkdir()
    (wd / "sub" / "t.json").write_text("{}")
    art = store.commit(key, wd, {"stage": "export"})
    assert not wd.exists()
    again = store.get(key)
    assert again is not None and again.digest == art.digest
    assert set(again.meta["files"]) == {"model.onnx", "sub/t.json"}
    assert store.verify(again)
    (again.path / "model.onnx").write_bytes(b"tampered")
    assert not store.verify(again)
    assert [a.key for a in store.all()] == [key]


def test_interrupted_workdirs_are_cleaned(tmp_path):
    store = ArtifactStore(tmp_path / "a").open()
    wd = store.new_workdir()
    (wd / "half.onnx").write_bytes(b"half")
    assert store.clean_tmp() == 1
    assert not any(store.tmp.iterdir())
    assert store.all() == []


def test_a_part_by_part_stage_keeps_its_work_folder_until_its_key_is_stored(tmp_path):
    """The kept work folder of a key survives the store's cleaning (a re-run resumes in it)
    until it is stored or grows old; other work folders are cleaned."""
    import os
    import time

    from studio.core.artifacts import PART_DONE, RESUME_DAYS

    store = ArtifactStore(tmp_path / "a").open()
    key = artifact_key("export", {"p": 1}, {}, {})
    wd = store.new_workdir(key)
    (wd / "part1_of_2").mkdir()
    (wd / "part1_of_2" / "decode.onnx").write_bytes(b"done")
    store.drop_workdir(wd)  # failed before any part was finished: nothing to keep
    assert not wd.exists()
    wd = store.new_workdir(key)
    (wd / "part1_of_2").mkdir()
    (wd / "part1_of_2" / "decode.onnx").write_bytes(b"done")
    (wd / "part1_of_2" / PART_DONE).write_text("{}")
    store.drop_workdir(wd)  # a finished part: kept for the next run of the key
    store.new_workdir()
    empty = store.new_workdir(artifact_key("export", {"p": 3}, {}, {}))
    assert store.clean_tmp() == 2 and not empty.exists()  # the random one, the empty kept one
    assert store.new_workdir(key) == wd and (wd / "part1_of_2" / "decode.onnx").exists()
    (wd / "part1_of_2" / PART_DONE).unlink()  # what the stage does before it returns
    art = store.commit(key, wd, {"stage": "export"})
    assert not wd.exists() and set(art.meta["files"]) == {"part1_of_2/decode.onnx"}
    stale = store.new_workdir(artifact_key("export", {"p": 2}, {}, {}))
    (stale / "part1_of_2").mkdir()
    (stale / "part1_of_2" / PART_DONE).write_text("{}")
    old = time.time() - (RESUME_DAYS + 1) * 86400
    os.utime(stale, (old, old))
    assert store.clean_tmp() == 1 and not stale.exists()
