"""The Reports page exports the report of a run of the history as HTML, Markdown, PDF or
JSON (assembled off the UI thread, the PDF printed with Qt), from a real project run."""

from __future__ import annotations

import json
import re

import jsonschema

from studio.services import reports


def _wait(qtbot, task):
    qtbot.waitUntil(task.done, timeout=120_000)
    return task.result()


def test_the_reports_page_exports_a_run_in_each_format(
        make_window, copy_project, exported_template, tmp_path, qtbot, monkeypatch):
    win = make_window()
    path = copy_project(exported_template, tmp_path / "p")
    assert win.open_project(path)
    rep = win.show_page("Reports")
    # a run with results but no report file yet: the export is offered
    assert rep.content.isVisibleTo(rep) and rep.run_combo.count() >= 1
    assert rep.export_button.isEnabled()
    assert [rep.format_combo.itemData(i) for i in range(rep.format_combo.count())] == [
        "html", "md", "pdf", "json"]
    run = rep.run_combo.currentData()
    written = {}
    for fmt in ("html", "md", "pdf", "json"):
        out = tmp_path / "out" / f"report.{fmt}"
        _wait(qtbot, rep.export_report(fmt, out, run))
        assert rep.export_status.text() == f"Wrote {out}"
        written[fmt] = out.read_bytes()
    html = written["html"].decode()
    assert "<h1>" in html and not re.search(r"""(?:src|href)\s*=\s*["']?(?:https?:)?//""", html)
    assert "No validation ran" in html  # this run exported only
    assert "| gate |" not in written["md"].decode() and b"# QStudio report" in written["md"]
    assert written["pdf"].startswith(b"%PDF") and re.search(rb"/Type\s*/Page\b", written["pdf"])
    data = json.loads(written["json"])
    jsonschema.validate(data, json.loads(reports.SCHEMA_PATH.read_text()))
    assert data["run"]["id"] == run

    # the Export… button asks where (the default: the project's reports folder) and the
    # written page is listed with the others
    from studio.ui.pages import reports as page_mod

    asked = []

    def save_as(_parent, _title, default, _filter):
        asked.append(default)
        return default, _filter

    monkeypatch.setattr(page_mod.QFileDialog, "getSaveFileName", staticmethod(save_as))
    rep.format_combo.setCurrentIndex(rep.format_combo.findData("html"))
    rep.export_button.click()
    assert asked == [str(path.with_suffix(".studio") / "reports" / f"run-{run}.html")]
    _wait(qtbot, rep._export_task)
    assert rep.model.rowCount() == 1 and rep.model.index(0, 0).data() == f"run-{run}.html"

    # an unwritable place: one line on the page, nothing written
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    _wait(qtbot, rep.export_report("md", blocker / "r.md", run))
    assert "a folder on its path is a file" in rep.export_status.text()
    assert rep.export_button.isEnabled()
