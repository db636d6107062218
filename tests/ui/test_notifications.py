"""Notifications in one fixed place: the status bar's line (the newest, with its actions) and
the list its button opens. Nothing a notification does — arrive, run out, be dismissed —
moves a widget of the page or changes the status bar's height."""

from __future__ import annotations

from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QPushButton, QToolButton, QWidget

from studio.ui.clipcheck import clipped_texts

LONG = ("✖ compile[snapdragon-8-gen-3] failed: the context binary is larger than the 1.0 GiB "
        "the chip maps in one session; split the model into parts (export.parts) or lower "
        "the context length")


def _geometry(win, page: QWidget) -> dict[int, tuple[QPoint, int, int]]:
    """Every shown widget of the page: where it is in the window, and its size."""
    return {id(w): (w.mapTo(win, QPoint(0, 0)), w.width(), w.height())
            for w in [page, *page.findChildren(QWidget)] if w.isVisible()}


def test_notifications_never_move_the_page(window, project_path, qtbot):
    win = window
    assert win.open_project(project_path)
    page = win.show_page("Overview")
    qtbot.wait(300)
    before = _geometry(win, page)
    bar = win.statusBar().geometry()
    assert len(before) > 20

    win.notify("Saved profile.json (chrome, 1,234 events, simulated)", "info", timeout_ms=300)
    win.notify(LONG, "error")
    n = win.notify("proj.qstudio was changed outside QStudio.", "error")
    n.add_action("Reload from disk", lambda: None)
    n.add_action("Keep my version", lambda: None)
    qtbot.wait(100)
    assert _geometry(win, page) == before
    assert win.statusBar().geometry() == bar
    qtbot.wait(500)  # the info's time ran out: it leaves the status line, not the list
    assert _geometry(win, page) == before
    assert len(win.notifications.texts()) == 3
    win.notifications.clear()
    qtbot.wait(50)
    assert _geometry(win, page) == before and win.statusBar().geometry() == bar
    assert win.notifications.texts() == [] and win.notifications.current is None


def test_the_status_line_shows_the_newest_with_its_actions(window, qtbot):
    area = window.notifications
    ran = []
    window.notify("first, an info that runs out", "info", timeout_ms=200)
    n = window.notify("export failed: context_length 4096 is beyond the model", "error")
    n.add_action("Show log", lambda: ran.append("log"))
    assert area.current is n and area.line.full_text() == n.text.text()
    assert area.property("role") == "note-error"
    buttons = [b for b in area.findChildren(QToolButton) if b.isVisibleTo(area)]
    show = next(b for b in buttons if b.text() == "Show log")
    show.click()  # runs the action and dismisses the notification
    assert ran == ["log"] and n not in area.items
    # the older info is current again until its time runs out; then the line is empty
    assert area.current is not None and area.current.text.text().startswith("first")
    qtbot.waitUntil(lambda: area.current is None, timeout=2000)
    assert area.texts() == ["first, an info that runs out"]  # still listed
    assert area.line.full_text() == "" and area.hide_button.isHidden()
    assert window.notifications.button.text() == "Notifications (1)"


def test_a_notification_under_the_pointer_stays(window, qtbot):
    area = window.notifications
    window.notify("an info the user is reading", "info", timeout_ms=100)
    area.setAttribute(Qt.WidgetAttribute.WA_UnderMouse, True)
    qtbot.wait(400)
    assert area.current is not None  # not taken from under the pointer
    area.setAttribute(Qt.WidgetAttribute.WA_UnderMouse, False)
    qtbot.waitUntil(lambda: area.current is None, timeout=5000)


def test_errors_are_readable_in_the_line_and_the_list(window, qtbot):
    area = window.notifications
    n = window.notify(LONG, "error")
    window.notify("an info after it", "info")
    qtbot.wait(50)
    # the line elides what does not fit and keeps the whole text in its tool tip
    assert area.line.full_text() == "an info after it"
    area.hide_current()
    assert area.current is n and LONG in area.line.toolTip()
    assert area.line.fontMetrics().horizontalAdvance(area.line.text()) <= area.line.width()
    # the list: every notification in full, newest first, nothing cut
    window.notifications.button.click()
    qtbot.waitUntil(area.list.isVisible, timeout=2000)
    rows = sorted((w for w in area.list.findChildren(type(n)) if w.isVisible()),
                  key=lambda w: w.mapTo(area.list, QPoint(0, 0)).y())
    assert [r.text.text() for r in rows] == ["an info after it", LONG]
    assert clipped_texts(area.list) == []
    assert area.list.geometry().bottom() <= window.notifications.button.mapToGlobal(
        QPoint(0, 0)).y()  # above the button, over the page (never pushing it)
    close = next(b for b in n.findChildren(QToolButton) if b.text() == "✕")
    close.click()
    qtbot.waitUntil(lambda: n not in area.items, timeout=2000)
    assert area.texts() == ["an info after it"]
    area.list.hide()


def test_notify_keeps_its_api(window):
    n = window.notify("Unsaved edits from 2026-12-01 were found (gates.x).", "info")
    hit = []
    n.add_action("Restore them", lambda: hit.append(1))
    n.add_action("Discard", lambda: hit.append(2))
    restore = next(b for b in n.findChildren(QPushButton) if b.text() == "Restore them")
    restore.click()
    assert hit == [1] and window.notifications.texts() == []
