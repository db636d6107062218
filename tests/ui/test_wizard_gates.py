"""The wizard's accuracy gates: spin boxes with the recipe's defaults and help, written into the
new project file."""

from __future__ import annotations

import tomllib

import pytest

from studio.core.recipe import DEFAULT_GATES, GATE_HELP


def _answer(wiz, folder, name):
    """Fill the wizard the way the user does for a small sample project."""
    src = wiz.source_page
    src.sample_radio.setChecked(True)
    src.sample.setCurrentIndex(src.sample.findData("tiny-coder"))
    assert src.validatePage(), src.error.text()
    r = wiz.recipe_page
    r.samples.setValue(2)
    r.prompt.setValue(16)
    r.context.setValue(64)
    wiz.location_page.name.setText(name)
    wiz.location_page.folder.setText(str(folder))
    assert wiz.location_page.isComplete()


def _gates_on_disk(path) -> dict:
    with open(path, "rb") as f:
        return tomllib.load(f)["gates"]


def test_wizard_shows_the_gates_with_their_defaults_and_help(window):
    wiz = window.new_project()
    spins = wiz.recipe_page.gates
    assert list(spins) == list(DEFAULT_GATES)
    for key, default in DEFAULT_GATES.items():
        spin = spins[key]
        assert spin.value() == pytest.approx(default), key
        assert GATE_HELP[key] in spin.toolTip()
        assert spin.minimum() <= default <= spin.maximum()
    assert spins["min_logits_cosine"].maximum() == 1.0
    assert spins["min_top1_agreement"].maximum() == 1.0
    wiz.reject()


def test_wizard_writes_the_default_gates(window, tmp_path):
    wiz = window.new_project()
    _answer(wiz, tmp_path / "made", "defaults")
    assert wiz.spec().gates == DEFAULT_GATES
    wiz.accept()
    path = window.ctl.project.path
    on_disk = _gates_on_disk(path)
    assert on_disk["min_top1_agreement"] == 0.9  # not 0
    assert on_disk == DEFAULT_GATES


def test_wizard_writes_the_gates_the_user_chose(window, tmp_path):
    wiz = window.new_project()
    _answer(wiz, tmp_path / "made", "strict")
    spins = wiz.recipe_page.gates
    spins["min_logits_cosine"].setValue(0.995)
    spins["max_perplexity_increase"].setValue(0.12)
    spins["min_top1_agreement"].setValue(0.75)
    wiz.accept()
    assert wiz.result() == wiz.DialogCode.Accepted
    chosen = {
        "min_logits_cosine": 0.995,
        "max_perplexity_increase": 0.12,
        "min_top1_agreement": 0.75,
    }
    assert window.ctl.project.gates == {**DEFAULT_GATES, **chosen}
    assert _gates_on_disk(window.ctl.project.path) == {**DEFAULT_GATES, **chosen}
