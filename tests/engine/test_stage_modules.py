"""One module per stage: the worker finds a stage's function from its declaration, and a new
stage is one declaration (with its settings class) plus one module (shown with a stage made here, planned and run like
the others)."""

from __future__ import annotations

import pkgutil
import sys
import types

from studio.core import stagegraph
from studio.core.keys import StageSettings
from studio.core.stagegraph import DECLARATIONS, StageDecl
from studio.core.stages.validate import Heldout
from studio.worker import stages


def test_every_declaration_has_its_module_and_every_module_a_declaration():
    modules = {m.name for m in pkgutil.iter_modules(stages.__path__)
               if not m.name.startswith("_")}
    assert modules == {d.module for d in DECLARATIONS}
    for d in DECLARATIONS:
        assert stages.stage_function(d).__module__ == f"studio.worker.stages.{d.module}"


def test_a_new_stage_is_one_declaration_and_one_module(tmp_path, monkeypatch):
    from studio.core import project as pf
    from studio.core.progress import RecordingProgress
    from studio.worker.context import StageContext, host_metric, read_text

    class WordCountSettings(StageSettings):  # a key another stage declares, taken as it is
        heldout_text = Heldout.heldout_text

    def run(ctx: StageContext, progress) -> dict:
        s = WordCountSettings.of(ctx.config)
        words = len(read_text(s.path(s.heldout_text), "held-out text").split())
        return {"summary": f"{words} words", "metrics": [host_metric("heldout_words", words)]}

    module = types.ModuleType("studio.worker.stages.word_count")
    module.run = run  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, module.__name__, module)
    decl = StageDecl("word-count", "Word count", settings_class=WordCountSettings,
                     optional=True)
    monkeypatch.setattr(stagegraph, "DECLARATIONS", (*DECLARATIONS, decl))
    monkeypatch.setitem(stagegraph.STAGES, decl.name, decl)

    from studio.core.catalog import default_chip_key

    project = pf.new_project("words", "sample:tiny-coder", [default_chip_key()])
    pf.save(project, tmp_path / "words.qstudio")
    project = pf.load(tmp_path / "words.qstudio")
    [job] = stagegraph.plan(project, ["word-count"])
    out = stages.run_in_process(project, job, {}, tmp_path / "out", RecordingProgress())
    assert out["summary"].endswith(" words") and out["metrics"][0]["source"] == "measured"
    assert (tmp_path / "out" / "result.json").is_file()
