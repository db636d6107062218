"""A page does not move under the pointer when results arrive: the Profiler's Memory tab
keeps its cards and chart where they were when its plan comes in, a run that finishes
while the Overview is open leaves the page above its figures in place, a live profile does
not switch the tab one is reading; and a profile compared with an unchanged one reads 0 on
every row, never "-0". On a copy of the session's fully run small project."""

from __future__ import annotations

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QWidget

from tests.ui.conftest import wait_task

pytestmark = pytest.mark.slow


def _where(win, widgets) -> dict[int, tuple[QPoint, int, int]]:
    return {id(w): (w.mapTo(win, QPoint(0, 0)), w.width(), w.height()) for w in widgets}


def _open(make_window, copy_project, small_project, tmp_path, name="p"):
    win = make_window()
    win.resize(1280, 800)
    assert win.open_project(copy_project(small_project, tmp_path / name))
    return win


def test_the_memory_tab_does_not_reflow_when_its_plan_arrives(
        batch_run, small_project, make_window, copy_project, tmp_path, qtbot):
    win = _open(make_window, copy_project, small_project, tmp_path)
    page = win.show_page("Profiler")
    qtbot.waitUntil(lambda: page.data is not None, timeout=20_000)
    tab = page.memory
    page.tabs.setCurrentWidget(tab)  # starts the plan (in a thread)
    qtbot.wait(10)
    assert tab.result is None and tab.plot.property("message") == "Planning the graphs' memory…"
    fixed = [tab.plot, tab.card_grid, tab.graph.parentWidget(), *tab.cards.values()]
    before = _where(win, fixed)
    qtbot.waitUntil(lambda: tab.result is not None, timeout=60_000)
    qtbot.wait(100)
    assert _where(win, fixed) == before  # nothing moved when the figures came in
    assert not tab.plot.property("message")  # the chart draws the plan now
    for card in tab.cards.values():
        value = card.value
        assert value.text() != "–"
        assert value.width() >= value.fontMetrics().horizontalAdvance(value.text())


def test_a_finished_run_leaves_the_overview_in_place(
        batch_run, small_project, make_window, copy_project, tmp_path, qtbot):
    win = _open(make_window, copy_project, small_project, tmp_path)
    page = win.show_page("Overview")
    qtbot.waitUntil(lambda: len(page.cards.cards) > 3, timeout=20_000)
    qtbot.wait(300)
    box = page.results_box
    above = [w for w in page.findChildren(QWidget)
             if w.isVisible() and not box.isAncestorOf(w) and w is not box
             and not w.isAncestorOf(box)]
    before = _where(win, [*above, box])
    first_card = page.cards.cards[0].mapTo(win, QPoint(0, 0))
    count = len(page.cards.cards)
    summary = wait_task(qtbot, win.run_stages(["report"]), timeout=120_000)
    assert summary.state == "succeeded"
    win.show_page("Overview")  # the run showed the Jobs page; back to where the user was
    # once the page has loaded the new run (in a thread: slower on a loaded host), nothing
    # above the results has moved
    qtbot.waitUntil(lambda: len(page.cards.cards) == count
                    and _where(win, [*above, box]) == before, timeout=15_000)
    assert page.cards.cards[0].mapTo(win, QPoint(0, 0)) == first_card


def test_an_unchanged_profile_compares_as_zero_never_minus_zero(
        batch_run, small_project, make_window, copy_project, tmp_path, qtbot):
    """The profile stage taken from the cache: a newer job with the same profile. Every
    change reads 0, uncoloured — the signed format wrote '-0' for each (0.0 read from the
    newer side is -0.0)."""
    from studio.services.session import Studio

    path = copy_project(small_project, tmp_path / "p")
    studio = Studio.open(path)
    try:
        jobs = studio.jobs
        old = next(j for j in jobs.jobs() if j.stage.startswith("profile")
                   and j.state == "succeeded")
        run = jobs.create_run({"stages": [old.stage], "settings": None})
        new = jobs.add_job(run, old.stage, old.target)
        jobs.update_job(new, state="succeeded", progress=1.0, artifact_key=old.artifact_key,
                        cached=True, result=old.result, message=old.message)
        jobs.finish_run(run, "succeeded")
    finally:
        studio.close()
    win = make_window()
    win.resize(1280, 800)
    assert win.open_project(path)
    page = win.show_page("Profiler")
    qtbot.waitUntil(lambda: page.data is not None and page.data.job.id == new, timeout=20_000)
    page.tabs.setCurrentIndex(page.tabs.indexOf(page.delta_plot.parentWidget().parentWidget()))
    assert page.against.currentData() == old.id
    rows = page.diff.rowCount()
    assert rows > 5
    deltas = [page.diff.index(r, 3).data() for r in range(rows)]
    assert deltas == ["0"] * rows, deltas
    assert all(page.diff.index(r, 3).data(Qt.ItemDataRole.ForegroundRole) is None
               for r in range(rows))
    # the bars and the column name the same change (the shown profile, A, is the newer)
    assert page.diff.columns[3] == "Δ A − B"
    assert page.delta_plot.getAxis("bottom").labelText == "Δ share, percentage points (A − B)"


def test_a_live_profile_does_not_switch_the_tab_one_reads(
        batch_run, small_project, make_window, copy_project, tmp_path, qtbot):
    win = _open(make_window, copy_project, small_project, tmp_path)
    page = win.show_page("Profiler")
    qtbot.waitUntil(lambda: page.data is not None, timeout=20_000)
    page.tabs.setCurrentWidget(page.memory)
    partials = []
    win.ctl.job_partial.connect(lambda jid, data: partials.append(jid))
    win.ctl.set("profile", "repeats", 2)
    page.profile_again()
    win.show_page("Profiler")
    qtbot.waitUntil(lambda: len(partials) >= 1, timeout=120_000)
    assert page.tabs.currentWidget() is page.memory  # the op table fills in behind it
    qtbot.waitUntil(lambda: not win.ctl.running, timeout=120_000)
    assert page.tabs.currentWidget() is page.memory
