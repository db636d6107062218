"""A checkpoint's full check is remembered on the machine: a new project of a checkpoint this
machine already checked does not load it again (studio.services.preflight)."""

from __future__ import annotations

import json

import pytest

from studio.core import project as pf
from studio.core.errors import StudioError
from studio.core.stagegraph import plan
from studio.engine import checkpoint_check
from studio.services import preflight as pre
from tests.conftest import small_sample_project


@pytest.mark.slow  # the real check loads the sample with transformers
def test_a_new_project_of_a_checked_checkpoint_is_not_loaded_again(monkeypatch, tmp_path):
    cfg = tmp_path / "config"
    monkeypatch.setenv("QSTUDIO_CONFIG_DIR", str(cfg))
    monkeypatch.setattr(pre, "_VERIFIED", set())  # as a new process
    calls = []
    real = checkpoint_check.check_checkpoint
    monkeypatch.setattr(checkpoint_check, "check_checkpoint",
                        lambda path: calls.append(path) or real(path))

    def check(name: str) -> None:
        p = pf.load(small_sample_project(tmp_path / name, name))
        pre.preflight(p, plan(p, ["export"]))

    check("a")
    assert len(calls) == 1  # the real check, once
    (entry,) = json.loads((cfg / "checked.json").read_text()).values()
    assert entry["what"] == "checkpoint" and entry["refs"] == ["sample:tiny-coder"]
    monkeypatch.setattr(pre, "_VERIFIED", set())  # another process, another project
    check("b")
    assert len(calls) == 1
    (cfg / "checked.json").write_text("{not json")  # a damaged file: as if empty
    monkeypatch.setattr(pre, "_VERIFIED", set())
    check("c")
    assert len(calls) == 2
    assert len(json.loads((cfg / "checked.json").read_text())) == 1  # written anew


@pytest.mark.slow  # the real check loads the sample with transformers
def test_studio_new_and_the_first_run_check_a_checkpoint_once(monkeypatch, tmp_path):
    """``studio new --checkpoint`` leaves its verdict on the machine and the project's first
    run takes it; the verdict is keyed by what the checks read (the weights' headers and
    sizes, every other file's bytes), so new weights under the same header keep it and an
    edited tokenizer or a truncated file does not."""
    import shutil

    from studio.core import samples
    from studio.services.projects import source_ref

    monkeypatch.setenv("QSTUDIO_CONFIG_DIR", str(tmp_path / "config"))
    monkeypatch.setattr(pre, "_VERIFIED", set())
    calls = []
    real = checkpoint_check.check_checkpoint
    monkeypatch.setattr(checkpoint_check, "check_checkpoint",
                        lambda path: calls.append(path) or real(path))
    ck = tmp_path / "ck"
    shutil.copytree(samples.sample_path("tiny-coder"), ck)
    assert source_ref("checkpoint", str(ck)) == str(ck.resolve())
    assert len(calls) == 1
    monkeypatch.setattr(pre, "_VERIFIED", set())  # the run: another process
    p = pf.load(small_sample_project(tmp_path / "p", "p", model={"source": str(ck)}))
    pre.preflight(p, plan(p, ["export"]))
    assert len(calls) == 1

    weights = ck / "model.safetensors"
    data = bytearray(weights.read_bytes())
    data[-4:] = bytes(4) if data[-4:] != bytes(4) else b"\x00\x00\x80\x3f"  # one weight
    weights.write_bytes(bytes(data))
    monkeypatch.setattr(pre, "_VERIFIED", set())
    assert source_ref("checkpoint", str(ck))
    assert len(calls) == 1  # the checks read no weight data: the same verdict

    tok = ck / "tokenizer.json"
    tok.write_text(tok.read_text().replace('"added_tokens"', '"added_tokens" ', 1))
    assert source_ref("checkpoint", str(ck))
    assert len(calls) == 2  # a file the checks read changed: checked again
    weights.write_bytes(bytes(data[:-4]))  # truncated
    with pytest.raises(StudioError, match="truncated"):
        source_ref("checkpoint", str(ck))
    assert len(calls) == 3
