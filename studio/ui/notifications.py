"""Notifications in one fixed place: the window's status bar.

The newest notification is shown at the left of the status bar (its text on one line, elided
to the width it has, the whole text in its tool tip; its actions beside it); every
notification also stays in a list that the button at the status bar's right opens (newest
first, each with its whole text, its time, its actions and a close button) until it is
dismissed or the project is closed.

Nothing here changes the geometry of the page above the status bar: the window gives the
status bar a fixed height, the status line's text is elided to the width it is given, and a
notification whose time runs out only leaves the status line (it stays in the list). A
notification the pointer rests on is not taken away while it is there.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtCore import QPoint, Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QFrame,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from studio.ui.widgets import ElidedLabel, label

#: the sign before a notification's text, by level
GLYPHS = {"error": "✖", "info": "ℹ"}
#: how many notifications the list keeps (the oldest go first)
HISTORY = 100


class Notification(QFrame):
    """One message with its actions: a row of the notifications list. ``add_action`` adds a
    button (the status line shows the same actions while this is its newest notification);
    ``dismiss`` removes it from the list and the status line."""

    closed = Signal()
    #: an action was added (the status line shows the actions of its notification)
    changed = Signal()

    def __init__(self, text: str, level: str = "info", parent: QWidget | None = None):
        super().__init__(parent)
        self.level = "error" if level == "error" else "info"
        self.created = time.time()
        #: the status line no longer shows it (its time ran out, or the user hid it there)
        self.expired = False
        self.actions: list[tuple[str, Callable[[], None]]] = []
        # an error in red; an info plain (the amber of a warning banner said "warning")
        self.setProperty("role", "banner-error" if self.level == "error" else "banner-ok")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 6, 4, 6)
        lay.setSpacing(4)
        top = QHBoxLayout()
        top.setSpacing(6)
        self.text = label(text, wrap=True, selectable=True)
        top.addWidget(self.text, 1)
        self.when = label(time.strftime("%H:%M", time.localtime(self.created)), "muted")
        top.addWidget(self.when, 0, Qt.AlignmentFlag.AlignTop)
        close = QToolButton()
        close.setText("✕")
        close.setAutoRaise(True)
        close.setToolTip("Dismiss")
        close.clicked.connect(self.dismiss)
        top.addWidget(close, 0, Qt.AlignmentFlag.AlignTop)
        lay.addLayout(top)
        self._buttons = QHBoxLayout()
        self._buttons.addStretch(1)
        lay.addLayout(self._buttons)
        self._gone = False

    def add_action(self, text: str, slot: Callable[[], object], close: bool = True) -> QPushButton:
        """A button that runs ``slot`` (and dismisses the notification when ``close``)."""

        def run() -> None:
            slot()
            if close:
                self.dismiss()

        b = QPushButton(text)
        b.clicked.connect(run)
        self._buttons.addWidget(b)
        self.actions.append((text, run))
        self.changed.emit()
        return b

    def dismiss(self) -> None:
        if self._gone:
            return
        self._gone = True
        self.hide()
        self.closed.emit()
        self.deleteLater()


class NotificationList(QFrame):
    """The list of notifications (newest first), opened from the status bar's button as a
    popup above it: it closes on a click outside, and covers the page only while open."""

    WIDTH = 500

    def __init__(self, parent: QWidget | None = None):
        super().__init__(parent, Qt.WindowType.Popup)
        self.setObjectName("notification-list")
        self.setFrameShape(QFrame.Shape.StyledPanel)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(8, 8, 8, 8)
        self.head = QWidget()
        head = QHBoxLayout(self.head)
        head.setContentsMargins(0, 0, 0, 0)
        head.addWidget(label("Notifications", "heading"), 1)
        self.clear_button = QPushButton("Clear all")
        self.clear_button.setToolTip("Dismiss every notification")
        head.addWidget(self.clear_button)
        lay.addWidget(self.head)
        self.scroll = QScrollArea()
        self.scroll.setWidgetResizable(True)
        self.scroll.setFrameShape(QFrame.Shape.NoFrame)
        self.scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        inner = QWidget()
        self.rows = QVBoxLayout(inner)
        self.rows.setContentsMargins(0, 0, 0, 0)
        self.rows.setSpacing(6)
        self.none = label("No notifications.", "muted")
        self.rows.addWidget(self.none)
        self.rows.addStretch(1)
        self.scroll.setWidget(inner)
        lay.addWidget(self.scroll, 1)
        self.setFixedWidth(self.WIDTH)

    def insert(self, n: Notification) -> None:
        self.rows.insertWidget(0, n)

    def set_empty(self, empty: bool) -> None:
        self.none.setVisible(empty)

    def open_at(self, anchor: QWidget) -> None:
        """Show the list above ``anchor`` (its right edges aligned), as tall as its rows up
        to 60% of the window."""
        window = anchor.window()
        lay = self.layout()
        m = lay.contentsMargins()
        inner = self.scroll.widget()
        wide = self.width() - m.left() - m.right()
        rows = (inner.heightForWidth(wide) if inner.hasHeightForWidth()
                else inner.sizeHint().height())  # wrapped texts: as tall as at this width
        want = m.top() + m.bottom() + self.head.sizeHint().height() + lay.spacing() + rows + 2
        height = max(100, min(want, int(window.height() * 0.6)))
        self.setFixedHeight(height)
        corner = anchor.mapToGlobal(QPoint(anchor.width(), 0))
        self.move(corner.x() - self.width(), corner.y() - height - 2)
        self.show()
        self.raise_()


class NotificationArea(QFrame):
    """The status line: the newest notification still current (an error until it is
    dismissed, an info until its ``timeout_ms`` runs out), one line, with its actions and a
    button that hides it there. ``button`` (for the status bar's right end) counts the
    notifications and opens ``list`` with all of them. ``notify`` keeps the signature the
    banners had: ``notify(text, level, timeout_ms) -> Notification``."""

    def __init__(self, limit: int = HISTORY, parent: QWidget | None = None):
        super().__init__(parent)
        self.limit = limit
        self.items: list[Notification] = []  # newest first
        self.current: Notification | None = None
        self.setProperty("role", "note")
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Fixed)
        lay = QHBoxLayout(self)
        lay.setContentsMargins(6, 0, 2, 0)
        lay.setSpacing(4)
        self.glyph = QLabel("")
        lay.addWidget(self.glyph)
        self.line = ElidedLabel("")
        self.line.setCursor(Qt.CursorShape.PointingHandCursor)
        self.line.clicked.connect(self.open_list)
        lay.addWidget(self.line, 1)
        self._action_row = QHBoxLayout()
        self._action_row.setSpacing(2)
        lay.addLayout(self._action_row)
        self.hide_button = QToolButton()
        self.hide_button.setText("✕")
        self.hide_button.setAutoRaise(True)
        self.hide_button.setToolTip("Hide it here (it stays in the notifications list)")
        self.hide_button.clicked.connect(self.hide_current)
        lay.addWidget(self.hide_button)
        self.list = NotificationList()
        self.list.clear_button.clicked.connect(self.clear)
        self.button = QToolButton()
        self.button.setObjectName("notifications-button")
        self.button.setAutoRaise(True)
        self.button.clicked.connect(self.open_list)
        fm = self.button.fontMetrics()
        self.button.setFixedWidth(fm.horizontalAdvance("Notifications (99+)") + 20)
        self._show_current()

    # ---- the API of the window ------------------------------------------------------------
    def notify(self, text: str, level: str = "info", timeout_ms: int = 0) -> Notification:
        """Add a notification: it heads the list and takes the status line. With
        ``timeout_ms`` it leaves the status line after that long (never while the pointer
        is on it); it stays in the list until dismissed."""
        n = Notification(text, level)
        n.closed.connect(lambda n=n: self._forget(n))
        n.changed.connect(lambda n=n: n is self.current and self._show_current())
        self.items.insert(0, n)
        self.list.insert(n)
        while len(self.items) > self.limit:
            self.items[-1].dismiss()
        if timeout_ms:
            QTimer.singleShot(timeout_ms, self, lambda n=n: self._expire(n))
        self._show_current()
        return n

    def clear(self) -> None:
        for n in list(self.items):
            n.dismiss()

    def texts(self) -> list[str]:
        """The notifications' texts, newest first."""
        return [n.text.text() for n in self.items]

    def open_list(self) -> None:
        self.list.set_empty(not self.items)
        self.list.open_at(self.button)

    def hide_current(self) -> None:
        """Take the status line's notification off it (it stays in the list)."""
        if self.current is not None:
            self.current.expired = True
        self._show_current()

    # ---- the status line -------------------------------------------------------------------
    def _expire(self, n: Notification) -> None:
        if n not in self.items:
            return
        if n is self.current and self.underMouse():  # never from under the pointer
            QTimer.singleShot(2000, self, lambda n=n: self._expire(n))
            return
        n.expired = True
        self._show_current()

    def _forget(self, n: Notification) -> None:
        if n in self.items:
            self.items.remove(n)
        self._show_current()

    def _show_current(self) -> None:
        n = next((i for i in self.items if not i.expired), None)
        self.current = n
        while self._action_row.count():
            w = self._action_row.takeAt(0).widget()
            if w is not None:
                w.hide()
                w.deleteLater()
        if n is None:
            self.glyph.setText("")
            self.line.set_full_text("")
            self.setProperty("role", "note")
            self.hide_button.hide()
        else:
            self.glyph.setText(GLYPHS[n.level])
            text = n.text.text()
            self.line.set_full_text(text, tip=f"{text}\n\nClick for every notification")
            self.setProperty("role", f"note-{n.level}")
            for title, run in n.actions:
                b = QToolButton()
                b.setText(title)
                b.setAutoRaise(False)
                b.clicked.connect(run)
                self._action_row.addWidget(b)
                b.show()
            self.hide_button.show()
        self.style().unpolish(self)
        self.style().polish(self)
        self._update_button()

    def _update_button(self) -> None:
        count = len(self.items)
        errors = sum(1 for i in self.items if i.level == "error")
        shown = "99+" if count > 99 else str(count)
        self.button.setText(f"Notifications ({shown})" if count else "Notifications")
        self.button.setProperty("role", "has-errors" if errors else "")
        self.button.setToolTip(
            f"{count} notification(s), {errors} error(s): click to see them all"
            if count else "No notifications")
        self.button.style().unpolish(self.button)
        self.button.style().polish(self.button)
