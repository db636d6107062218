"""Help → Doctor in the window: the checks of this machine and the open project run off the
UI thread and fill the table, each status coloured and each finding with its fix; a project
with a short calibration text shows its FAIL row with the fix."""

from __future__ import annotations


def test_the_doctor_checks_the_open_project(window, project_path, qtbot, tmp_path):
    from studio.ui.doctor_dialog import STATUS_COLOURS

    short = tmp_path / "short.txt"
    short.write_text("def f(x):\n    return x\n")
    text = project_path.read_text()
    assert 'calibration_text = "sample:calibration"' in text
    project_path.write_text(text.replace('calibration_text = "sample:calibration"',
                                         f'calibration_text = "{short}"'))
    assert window.open_project(project_path)
    window.doctor_act.trigger()
    dialog = window.doctor_dialog
    qtbot.waitUntil(lambda: dialog.table.rowCount() > 0, timeout=60_000)
    rows = {dialog.table.item(r, 2).text(): r for r in range(dialog.table.rowCount())}
    qnn = rows["QNN HTP backend"]
    assert dialog.table.item(qnn, 0).text() == "PASS"
    assert dialog.table.item(qnn, 0).foreground().color().name() == STATUS_COLOURS["PASS"]
    cal = rows["quantization.calibration_text"]
    assert dialog.table.item(cal, 0).text() == "FAIL"
    assert "calibration_samples" in dialog.table.item(cal, 4).text()
    assert dialog.verdict.text().startswith("1 failed")
    assert dialog.check_btn.isEnabled() and dialog.check_btn.text() == "Run checks"
    dialog.grab().save(str(tmp_path / "doctor.png"))
    dialog.close()
