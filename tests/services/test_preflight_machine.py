"""A checkpoint's full check is remembered on the machine: a new project of a checkpoint this
machine already checked does not load it again (studio.services.preflight)."""

from __future__ import annotations

import json

import pytest

from studio.core import project as pf
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
