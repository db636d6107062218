"""Reports read in the window: the batch run's real HTML report in the Reports page's reader,
its inline SVG charts drawn as images (Qt's rich text has no <svg>), and its JSON as text."""

from __future__ import annotations

import pytest

pytestmark = pytest.mark.slow


def test_the_batch_reports_are_read_in_the_window_with_their_charts(
        batch_run, small_project, make_window, copy_project, tmp_path, qtbot):
    from PySide6.QtGui import QColor

    from studio.ui.report_view import inline_charts, render_svg

    reports = small_project.with_suffix(".studio") / "reports"
    report = max(reports.glob("report-*.html"))
    html = report.read_text(encoding="utf-8")
    swapped, charts = inline_charts(html)
    assert charts and "<svg" not in swapped and swapped.count("qstudio-chart:") == len(charts)
    image = render_svg(charts[0])
    assert image.width() >= 640  # drawn at twice its 640 px
    colours = {image.pixelColor(x, y).name() for x in range(0, image.width(), 9)
               for y in range(0, image.height(), 9)}
    assert len(colours) > 3 and QColor("white").name() in colours  # axes, bars, text

    win = make_window()
    assert win.open_project(copy_project(small_project, tmp_path / "p"))
    page = win.show_page("Reports")
    qtbot.waitUntil(lambda: page.model.rowCount() > 0, timeout=20_000)
    qtbot.waitUntil(lambda: page.reader.path is not None, timeout=5_000)
    reader = page.reader
    assert reader.path.suffix == ".html"
    text = reader.toPlainText()
    assert "simulated" in text and "measured" in text
    qtbot.waitUntil(lambda: reader.charts_drawn >= 1, timeout=5_000)  # laid out: drawn
    assert reader.charts_drawn <= len(inline_charts(reader.path.read_text())[1])
    page.show_json()
    assert reader.path.suffix == ".json" and reader.toPlainText().lstrip().startswith("{")


def test_a_file_too_large_to_lay_out_is_not_read_in_the_window(tmp_path, qtbot):
    """Qt lays out megabytes of one paragraph for minutes on the UI thread: a file past the
    reader's limit gets one line that says to open it in the browser."""
    from studio.ui.report_view import MAX_READ_BYTES, ReportView

    big = tmp_path / "report-1.html"
    big.write_bytes(b"x" * (MAX_READ_BYTES + 1))
    view = ReportView()
    qtbot.addWidget(view)
    view.show_file(big)
    assert view.toPlainText().startswith("report-1.html is 4.0 MiB: too large to read here")
    assert "browser" in view.toPlainText()
