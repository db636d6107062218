"""A sweep made in the window: the New sweep dialog offers the recipe's settings, fills in a
setting's closed set of values, checks the table as the project file's [[sweeps]] are
checked (one line when it cannot be run), and OK adds it to the project as one undoable edit
that the Sweeps page then shows and the saved file holds."""

from __future__ import annotations

from studio.core import project as projectfile
from studio.core.recipe import SCHEMES


def test_a_sweep_is_made_in_the_window_and_undone(window, project_path, qtbot):
    from studio.ui.sweep_dialog import NewSweepDialog, values_text

    assert window.open_project(project_path)
    page = window.show_page("Sweeps")
    assert page.empty.isVisibleTo(page) and "No sweeps" in page.empty.title.text()
    dialog = NewSweepDialog(window.ctl.project, page)
    keys = [dialog.keys[0].itemData(i) for i in range(dialog.keys[0].count())]
    assert "quantization.scheme" in keys and "quantization.calibration_samples" in keys
    assert "quantization.calibration_text" not in keys  # texts are not offered
    # the first axis starts on the scheme with every scheme, and says how many points
    assert dialog.keys[0].currentData() == "quantization.scheme"
    assert dialog.values[0].text() == values_text(SCHEMES)
    ok = dialog.buttons.button(dialog.buttons.StandardButton.Ok)
    assert ok.isEnabled() and dialog.verdict.text().startswith(f"{len(SCHEMES)} points")

    dialog.values[0].setText("W8A16, W9A9")  # a value the setting does not take
    assert not ok.isEnabled() and "W9A9" in dialog.verdict.text()
    assert "\n" not in dialog.verdict.text()
    dialog.values[0].setText("W8A16, W8A8")
    dialog.keys[1].setCurrentIndex(dialog.keys[1].findData("quantization.scheme"))
    assert not ok.isEnabled() and "one axis only" in dialog.verdict.text()
    dialog.keys[1].setCurrentIndex(dialog.keys[1].findData("quantization.calibration_samples"))
    assert dialog.values[1].text() == "" and dialog.values[1].placeholderText().startswith(
        "numbers")
    dialog.values[1].setText("2, 4")
    assert ok.isEnabled() and dialog.verdict.text().startswith("4 points")
    table = dialog.table()
    assert table == {"name": "sweep1", "best": "smallest", "axes": {
        "quantization.scheme": ["W8A16", "W8A8"], "quantization.calibration_samples": [2, 4]}}

    assert page.new_sweep(table)
    assert [t["name"] for t in window.ctl.project.sweeps] == ["sweep1"]
    assert page.content.isVisibleTo(page) and page.current_name() == "sweep1"
    assert page.spec_line.text().startswith("4 point(s): a grid of quantization.scheme")
    window.ctl.save()
    saved = projectfile.load(project_path)
    assert saved.sweeps[0]["axes"]["quantization.calibration_samples"] == [2, 4]
    window.ctl.undo()
    assert window.ctl.project.sweeps == []
    qtbot.waitUntil(lambda: page.empty.isVisibleTo(page), timeout=5_000)
