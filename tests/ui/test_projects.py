"""Projects in the window: the wizard's code path, open / broken / changed on disk, save,
dirty marker, undo/redo, autosave, close prompts, recent projects, window state."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QPushButton

from studio.core import project as projectfile
from studio.core.errors import StudioError
from studio.services import projects


# ---- creating --------------------------------------------------------------------------------
def test_wizard_creates_a_project(window, qtbot, tmp_path, make_spec):
    """The wizard's Finish calls ProjectController.create → projects.create_project."""
    from studio.ui.wizard import NewProjectWizard

    spec = make_spec(tmp_path)
    wiz = window.new_project()
    assert isinstance(wiz, NewProjectWizard)
    src = wiz.source_page
    if spec.source_kind == "sample":
        src.sample_radio.setChecked(True)
        src.sample.setCurrentIndex(src.sample.findData("tiny-coder"))
    else:
        src.ckpt.setText(spec.source)
    assert src.validatePage(), src.error.text()
    wiz.targets_page.set_targets(["snapdragon-8-gen-3", "snapdragon-x-elite"])
    r = wiz.recipe_page
    r.scheme.setCurrentText("W8A16")
    r.samples.setValue(2)
    r.prompt.setValue(16)
    r.context.setValue(64)
    r.stage_checks["profile"].setChecked(False)
    wiz.location_page.name.setText("Wizard made")
    wiz.location_page.folder.setText(str(tmp_path / "made"))
    assert wiz.location_page.isComplete()
    got = wiz.spec()
    assert got.path == tmp_path / "made" / "Wizard-made.qstudio"
    wiz.accept()
    assert wiz.result() == wiz.DialogCode.Accepted
    p = window.ctl.project
    assert p.path == (tmp_path / "made" / "Wizard-made.qstudio").resolve()
    assert p.name == "Wizard made"
    assert p.targets == ["snapdragon-8-gen-3", "snapdragon-x-elite"]
    assert (p.export.prompt_length, p.export.context_length, p.export.parts) == (16, 64, 1)
    assert "profile" not in p.pipeline["stages"]
    on_disk = projectfile.load(p.path)
    assert on_disk.quantization["calibration_samples"] == 2
    assert window.windowTitle().startswith("Wizard made")
    assert window.current_page() in ("Overview", window.current_page())
    assert window.settings.recent_projects()[0] == p.path


def test_wizard_reports_bad_answers_and_stays_open(window, tmp_path):
    wiz = window.new_project()
    wiz.source_page.ckpt.setText(str(tmp_path))  # a folder without config.json
    assert not wiz.source_page.validatePage()
    assert "config.json" in wiz.source_page.error.text()
    wiz.source_page.sample_radio.setChecked(True)
    wiz.recipe_page.prompt.setValue(64)
    wiz.recipe_page.context.setValue(32)  # C must be larger than P
    wiz.location_page.name.setText("bad")
    wiz.location_page.folder.setText(str(tmp_path / "bad"))
    wiz.accept()
    assert "context_length" in wiz.location_page.error.text()
    assert wiz.isVisible() and window.ctl.studio is None
    assert not (tmp_path / "bad" / "bad.qstudio").exists()
    wiz.reject()


def test_create_project_service_errors(tmp_path, make_spec):
    with pytest.raises(StudioError, match="no config.json"):
        projects.create_project(
            make_spec(tmp_path, source_kind="checkpoint", source=str(tmp_path))
        )
    (tmp_path / "junk.onnx").write_bytes(b"not a model")
    with pytest.raises(StudioError, match="not a valid ONNX model"):
        projects.create_project(
            make_spec(tmp_path, source_kind="onnx", source=str(tmp_path / "junk.onnx"))
        )
    with pytest.raises(StudioError, match="unknown sample"):
        projects.create_project(make_spec(tmp_path, source_kind="sample", source="nope"))
    assert not list(tmp_path.glob("*.qstudio"))


# ---- opening ------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "content, expect",
    [
        (b"schema_version = 1\nname = [unclosed", "not valid TOML"),
        (b"\xff\xfe\x00garbage", "not a text file"),
        (
            b'schema_version = 1\nname = "x"\ntargets = ["htp-v73"]\n[model]\nsource = "sample:tiny-coder"\n'
            b"[export]\nprompt_length = 64\ncontext_length = 32\n",
            "context_length",
        ),
        (b'schema_version = 99\nname = "x"\n', "newer QStudio"),
    ],
)
def test_broken_project_opens_to_a_clear_message(window, tmp_path, content, expect):
    path = tmp_path / "broken.qstudio"
    path.write_bytes(content)
    assert window.open_project(path) is False
    texts = window.notifications.texts()
    assert texts and texts[0].startswith("Could not open broken.qstudio:")
    assert expect in texts[0] and "The file was not changed" in texts[0]
    assert path.read_bytes() == content  # nothing lost
    assert window.ctl.studio is None
    assert not path.with_suffix(".studio").exists()
    assert window.stack.currentWidget() is window.welcome


def test_opening_a_broken_file_keeps_the_open_project(window, project_path, tmp_path,
                                                       monkeypatch):
    """File -> Open on a file that is no project, with a project open and edited: one
    message, no question about the edits, and the project stays open with them."""
    assert window.open_project(project_path)
    window.ctl.set("quantization", "calibration_samples", 3)
    asked = []
    monkeypatch.setattr(window, "confirm_unsaved", lambda: asked.append(1) or "cancel")
    for name, content in (("notes.txt", b"just some text\n"),
                          ("broken.qstudio", b"schema_version = 1\nname = [unclosed")):
        path = tmp_path / name
        path.write_bytes(content)
        assert window.open_project(path) is False
        text = window.notifications.texts()[0]
        assert text.startswith(f"Could not open {name}:") and "stays open" in text, text
        assert path.read_bytes() == content
    assert not asked
    assert window.ctl.studio is not None and window.ctl.project.path == project_path.resolve()
    assert window.ctl.dirty and window.ctl.project.quantization["calibration_samples"] == 3


def test_open_save_dirty_marker_and_close_prompt(window, project_path, monkeypatch):
    assert window.open_project(project_path)
    ctl = window.ctl
    assert not window.isWindowModified()
    ctl.set("quantization", "calibration_samples", 3)
    assert window.isWindowModified() and ctl.dirty
    # cancel keeps the project open
    monkeypatch.setattr(window, "confirm_unsaved", lambda: "cancel")
    assert window.close_project() is False
    assert ctl.studio is not None
    # save writes the file and clears the marker
    monkeypatch.setattr(window, "confirm_unsaved", lambda: "save")
    assert window.close_project() is True
    assert ctl.studio is None
    assert projectfile.load(project_path).quantization["calibration_samples"] == 3
    # discard drops the edit and its autosave
    assert window.open_project(project_path)
    ctl.set("quantization", "calibration_samples", 5)
    assert ctl.autosave_now() is not None
    monkeypatch.setattr(window, "confirm_unsaved", lambda: "discard")
    assert window.close_project()
    assert projectfile.load(project_path).quantization["calibration_samples"] == 3
    assert not (project_path.with_suffix(".studio") / "autosave.qstudio").exists()


def test_the_htp_compiler_options_are_recipe_edits(window, project_path, qtbot):
    """The Recipe tab's HTP compiler box sets [htp] (undoable like any recipe edit) and names
    the seed's knobs the QNN EP does not expose, with what each needs in its tooltip."""
    from studio.core.settings import NOT_EXPOSED

    assert window.open_project(project_path)
    page = window.show_page("Precision")
    p = window.ctl.project
    assert page.opt_level.currentData() == 0 and page.vtcm.value() == 0
    page.opt_level.setCurrentIndex(page.opt_level.findData(3))
    page.opt_level.activated.emit(page.opt_level.currentIndex())
    assert p.htp["optimization_level"] == 3
    page.vtcm.setValue(4)
    page.vtcm.editingFinished.emit()
    page.fp16_relax.setChecked(True)
    assert (p.htp["vtcm_mb"], p.htp["fp16_relaxation"]) == (4, True)
    window.undo_act.trigger()
    window.undo_act.trigger()
    assert (p.htp["vtcm_mb"], p.htp["fp16_relaxation"]) == (0, False)
    assert page.vtcm.value() == 0 and not page.fp16_relax.isChecked()
    assert page.graph_io.currentData() == "quantized"  # the default
    page.graph_io.setCurrentIndex(page.graph_io.findData("float"))
    page.graph_io.activated.emit(page.graph_io.currentIndex())
    assert p.htp["graph_io"] == "float"
    window.undo_act.trigger()
    assert p.htp["graph_io"] == "quantized" and page.graph_io.currentData() == "quantized"
    page.perf_mode.setCurrentIndex(page.perf_mode.findData("burst"))
    page.perf_mode.activated.emit(page.perf_mode.currentIndex())
    assert p.htp["performance_mode"] == "burst"
    window.undo_act.trigger()
    assert p.htp["performance_mode"] == "" and page.perf_mode.currentData() == ""
    note = next(w for w in page.findChildren(type(page.error)) if "Not exposed" in w.text())
    assert all(k in note.text() and NOT_EXPOSED[k] in note.toolTip() for k in NOT_EXPOSED)


def test_undo_redo_a_recipe_edit(window, project_path, qtbot):
    assert window.open_project(project_path)
    page = window.show_page("Precision")
    p = window.ctl.project
    assert p.quantization["scheme"] == "W8A16"
    assert not window.undo_act.isEnabled()
    # the user picks W8A8 in the scheme combo
    page.scheme.setCurrentIndex(page.scheme.findData("W8A8"))
    page.scheme.activated.emit(page.scheme.currentIndex())
    assert p.quantization["scheme"] == "W8A8"
    assert window.undo_act.isEnabled() and "W8A8" in window.undo_act.text()
    assert window.isWindowModified()
    # ... and types a sample count
    page.samples.setValue(7)
    page.samples.editingFinished.emit()
    assert p.quantization["calibration_samples"] == 7
    window.undo_act.trigger()
    assert p.quantization["calibration_samples"] == 2 and page.samples.value() == 2
    window.undo_act.trigger()
    assert p.quantization["scheme"] == "W8A16" and page.scheme.currentData() == "W8A16"
    assert not window.undo_act.isEnabled() and window.redo_act.isEnabled()
    assert not window.isWindowModified()  # back at the saved state
    window.redo_act.trigger()
    assert p.quantization["scheme"] == "W8A8" and page.scheme.currentData() == "W8A8"
    assert window.isWindowModified()
    # an invalid edit changes nothing and says why
    page.context_len.setValue(8)  # not larger than the prompt length
    page.context_len.editingFinished.emit()
    assert p.export["context_length"] == 64 and page.context_len.value() == 64
    assert "context_length" in page.error.text()
    # overrides are edits too
    page.pattern.setText("*.down_proj")
    page.prec.setCurrentText("INT16")
    assert page.add_override()
    assert p.quantization["overrides"] == {"*.down_proj": "INT16"}
    window.undo_act.trigger()
    assert p.quantization["overrides"] == {}
    assert page.overrides.rowCount() == 0


def test_targets_dialog_edit_is_undoable(window, project_path, monkeypatch):
    from studio.ui.pages import overview

    assert window.open_project(project_path)
    page = window.show_page("Overview")
    monkeypatch.setattr(
        overview.TargetsDialog, "exec", lambda self: overview.QDialog.DialogCode.Accepted
    )
    monkeypatch.setattr(overview.TargetsDialog, "chosen", lambda self: ["snapdragon-8-elite"])
    page.change_targets()
    assert window.ctl.project.targets == ["snapdragon-8-elite"]
    window.undo()
    assert window.ctl.project.targets == ["snapdragon-8-gen-3"]


def test_changed_on_disk_and_reload_lose_nothing(window, project_path, qtbot):
    assert window.open_project(project_path)
    ctl = window.ctl
    ctl.set("quantization", "calibration_samples", 9)  # an unsaved edit
    text = project_path.read_text().replace('scheme = "W8A16"', 'scheme = "W8A8"')
    time.sleep(0.01)
    project_path.write_text(text)  # someone else edits the file
    assert ctl.check_disk()
    assert any("changed outside QStudio" in t for t in window.notifications.texts())
    # saving now would overwrite their change: refused with a clear message
    assert window.save() is False
    assert any(
        "was changed outside QStudio since it was opened" in t for t in window.notifications.texts()
    )
    assert 'scheme = "W8A8"' in project_path.read_text()
    # reload: their version opens, our unsaved edit is offered back from the autosave
    found = []
    ctl.autosave_found.connect(lambda edits, when: found.append(edits))
    window.reload()
    assert ctl.project.quantization["scheme"] == "W8A8"
    assert ctl.project.quantization["calibration_samples"] == 2
    assert found and [(c.section, c.key, c.value) for c in found[0]] == [
        ("quantization", "calibration_samples", 9)
    ]
    assert ctl.apply_edits(found[0]) == []
    assert ctl.project.quantization["calibration_samples"] == 9 and ctl.dirty
    ctl.undo()  # the restore is undoable
    assert ctl.project.quantization["calibration_samples"] == 2


def test_changed_on_disk_into_a_broken_file_keeps_the_open_version(window, project_path):
    assert window.open_project(project_path)
    project_path.write_text("this is = not [ toml")
    assert window.ctl.check_disk()
    window.reload()
    assert any(
        "Could not reload" in t and "The open version is kept" in t
        for t in window.notifications.texts()
    )
    assert window.ctl.studio is not None and window.ctl.project.name == "proj"
    # save my version over it: the broken file is kept in the project folder
    window._force_save()
    assert projectfile.load(project_path).name == "proj"
    kept = list((project_path.with_suffix(".studio") / "conflicts").glob("*.qstudio"))
    assert len(kept) == 1 and kept[0].read_text() == "this is = not [ toml"


def test_autosave_survives_a_crash(window, project_path, make_window):
    assert window.open_project(project_path)
    window.ctl.set("gates", "min_logits_cosine", 0.95)
    assert window.ctl.autosave_now() is not None
    # the process dies here: nothing is saved, the session is dropped without closing
    studio, window.ctl.studio = window.ctl.studio, None
    studio.close()
    win2 = make_window()
    assert win2.open_project(project_path)
    texts = win2.notifications.texts()
    assert any("Unsaved edits from" in t and "gates.min_logits_cosine" in t for t in texts)
    note = win2.notifications.items[0]
    restore = next(b for b in note.findChildren(QPushButton) if b.text() == "Restore them")
    restore.click()
    assert win2.ctl.project.gates["min_logits_cosine"] == 0.95
    assert win2.ctl.dirty


def test_recent_projects_and_window_state(window, project_path, settings, make_window):
    assert window.open_project(project_path)
    window.show_page("Jobs")
    window.set_theme("dark")
    window.resize(1111, 777)
    window.close()
    assert settings.theme == "dark"
    win2 = make_window()
    try:
        assert settings.recent_projects()[0] == project_path.resolve()
        items = [
            win2.welcome.recent.item(i).data(Qt.ItemDataRole.UserRole)
            for i in range(win2.welcome.recent.count())
        ]
        assert str(project_path.resolve()) in items
        geometry, _state, page = settings.window_state()
        assert geometry is not None and page == "Jobs"
        assert win2.open_project(project_path)
        assert win2.current_page() == "Jobs"  # the page of the last session
        # a recent project that disappeared is removed from the list when clicked
        gone = Path(project_path).parent / "gone.qstudio"
        settings.add_recent(gone)
        win2.ctl.close()
        win2.welcome.refresh()
        item = next(
            win2.welcome.recent.item(i)
            for i in range(win2.welcome.recent.count())
            if "gone" in win2.welcome.recent.item(i).text()
        )
        assert "(missing)" in item.text()
        win2.welcome._activated(item)
        assert gone.resolve() not in settings.recent_projects()
    finally:
        win2.set_theme("light")
