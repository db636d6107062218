"""An empty chart says why it is empty (planning, nothing run yet, a failure) instead of
drawing bare 0–1 axes; the message fits inside the chart, and the axes come back with data."""

from __future__ import annotations

import pyqtgraph as pg

from tests.ui.test_sweeps_ui import _sweep_project


def _message_shown(plot) -> str:
    """The chart's message: its axes hidden, its text drawn inside the plot area."""
    item = plot.getPlotItem()
    assert not item.getAxis("left").isVisible() and not item.getAxis("bottom").isVisible()
    texts = [i for i in item.items if getattr(i, "is_plot_message", False)]
    assert len(texts) == 1
    view = item.getViewBox().sceneBoundingRect()
    drawn = texts[0].sceneBoundingRect()
    assert view.contains(drawn), (view, drawn)  # not cut at the chart's edges
    assert texts[0].toPlainText() == plot.property("message")
    return plot.property("message")


def test_the_memory_tab_says_it_plans_then_why_there_is_no_plan(window, project_path, qtbot):
    from studio.ui.pages.profiler_memory import MemoryTab

    assert window.open_project(project_path)
    tab = MemoryTab(window.ctl, pg)
    qtbot.addWidget(tab)
    tab.resize(1100, 600)
    tab.show()
    qtbot.wait(50)
    assert "made when this tab is shown" in _message_shown(tab.plot)
    with qtbot.waitSignal(tab.loaded, timeout=30_000):
        tab.load()
        assert _message_shown(tab.plot) == "Planning the graphs' memory…"
    # a fresh project has no graph to plan: the chart says what to run (wrapped to fit)
    text = _message_shown(tab.plot)
    assert text.startswith("No memory plan: no export or quantize result") and "--stages export" in text
    assert tab.result is None
    # the window's other loads (its pages' checks) end before the tab is closed: a load that
    # finishes on its thread after the tab is gone must not be the last to hold it
    window.ctl.shutdown()


def test_the_sweep_chart_before_any_point_ran(window, tmp_path, qtbot):
    assert window.open_project(_sweep_project(tmp_path / "sweep"))
    page = window.show_page("Sweeps")
    qtbot.wait(100)
    assert _message_shown(page.plot) == ("No point has both an accuracy and a size yet: run the "
                                         "sweep")


def test_the_axes_come_back_with_data(qtbot):
    from studio.ui.widgets import plot_axes, plot_message

    plot = pg.PlotWidget()
    qtbot.addWidget(plot)
    plot.resize(500, 300)
    plot.show()
    plot_message(plot, "Planning the graphs' memory…")
    _message_shown(plot)
    plot.clear()
    plot_axes(plot)
    plot.plot([0, 10, 20], [5, 500, 50])
    qtbot.wait(50)
    item = plot.getPlotItem()
    assert item.getAxis("left").isVisible() and item.getAxis("bottom").isVisible()
    assert not plot.property("message")
    (x0, x1), (y0, y1) = item.viewRange()
    assert x0 <= 0 and x1 >= 20 and y1 >= 500  # the ranges follow the data again, not 0–1
