"""The machine's shared artifact store (studio.services.sharedstore): projects of one machine
take each other's stored jobs instead of computing them again."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from studio.core.artifacts import ArtifactStore
from studio.core.errors import StudioError
from studio.services.sharedstore import shared_store
from tests.cli.conftest import studio
from tests.conftest import small_sample_project


def _machine(monkeypatch, tmp_path, body: str | None):
    cfg = tmp_path / "config"
    cfg.mkdir()
    if body is not None:
        (cfg / "settings.toml").write_text(body)
    monkeypatch.setenv("QSTUDIO_CONFIG_DIR", str(cfg))
    return cfg


def _stored(store: ArtifactStore, tmp_path, name: str = "a"):
    work = store.new_workdir()
    (work / "graph.onnx").write_bytes(b"\x08\x07" * 100)
    (work / "sub").mkdir()
    (work / "sub" / "data.bin").write_bytes(os.urandom(64))
    return store.commit(f"key-{name}", work, {"stage": "export"})


def test_adopt_links_the_files_and_keeps_what_the_store_holds(tmp_path):
    shared = ArtifactStore(tmp_path / "shared").open()
    mine = ArtifactStore(tmp_path / "project").open()
    art = _stored(shared, tmp_path)
    got = mine.adopt(art)
    assert got.key == art.key and got.meta == art.meta and got.path != art.path
    assert mine.verify(got)
    for name in ("graph.onnx", "sub/data.bin"):  # one copy on disk
        assert (got.path / name).stat().st_ino == (art.path / name).stat().st_ino
    assert not list(mine.tmp.iterdir())  # the work folder was moved into place
    assert mine.adopt(art).path == got.path  # already held: kept


def test_the_machine_settings_name_the_shared_store_or_none(monkeypatch, tmp_path):
    _machine(monkeypatch, tmp_path, None)
    assert shared_store() is None
    (tmp_path / "config" / "settings.toml").write_text("[artifacts]\nshared_store = \"\"\n")
    assert shared_store() is None
    (tmp_path / "config" / "settings.toml").write_text(
        f"[artifacts]\nshared_store = \"{tmp_path / 'store'}\"\n")
    store = shared_store()
    assert store is not None and store.objects.is_dir()
    (tmp_path / "config" / "settings.toml").write_text("[artifacts]\nshared_store = 3\n")
    with pytest.raises(StudioError, match="give a folder as a string"):
        shared_store()
    (tmp_path / "config" / "settings.toml").write_text("[artifacts\n")
    with pytest.raises(StudioError, match="cannot be read .*: fix it or remove it"):
        shared_store()


@pytest.mark.slow
def test_a_second_project_takes_the_export_the_first_stored(monkeypatch, tmp_path):
    """Project a computes its export and puts it in the shared store; project b (another
    folder, the same model and shapes) takes it, checked and hard-linked; with the shared
    copy gone, project c computes it again and puts it back."""
    shared_dir = tmp_path / "shared"
    _machine(monkeypatch, tmp_path, f"[artifacts]\nshared_store = \"{shared_dir}\"\n")

    def export(name: str) -> dict:
        f = small_sample_project(tmp_path / name, name)
        r = studio("--batch", f, "--stages", "export", "--json", "--quiet")
        assert r.returncode == 0, r.stderr[-2000:]
        (job,) = json.loads(r.stdout)["jobs"]
        return job

    a = export("a")
    assert not a["cached"]
    b = export("b")
    assert b["cached"] and b["message"] == "cached: from the machine's shared store"
    shared = ArtifactStore(shared_dir)
    (held,) = shared.all()
    mine = ArtifactStore(tmp_path / "b" / "b.studio" / "artifacts").get(held.key)
    assert mine is not None and mine.meta["digest"] == held.meta["digest"]
    first = next(p for p in held.path.rglob("*") if p.is_file() and p.name != "artifact.json")
    assert (mine.path / first.relative_to(held.path)).stat().st_ino == first.stat().st_ino
    shutil.rmtree(held.path)
    c = export("c")
    assert not c["cached"]
    assert [x.key for x in shared.all()] == [held.key]  # put back
