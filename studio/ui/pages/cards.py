"""The figure card (a value, its source, where it comes from), and a grid that reflows them to the width it gets (so a
page of cards never scrolls sideways)."""

from __future__ import annotations

from PySide6.QtCore import QEvent, QSize, Qt
from PySide6.QtWidgets import (
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QLayout,
    QVBoxLayout,
    QWidget,
)

from studio.ui.widgets import SourceBadge, label

STALE_COLOR = "#9a6700"
#: no card is narrower than this (cards side by side line up)
MIN_CARD_WIDTH = 190


class ValueLabel(QLabel):
    """A card's value: never narrower than its text, nor than ``reserve`` (the widest value
    the card will show, for a card filled in later: it gets its width from the start, so the
    page does not reflow when the value arrives)."""

    def __init__(self, text: str, reserve: str = ""):
        super().__init__(text)
        self.reserve = reserve
        self.setProperty("role", "metric-value")

    def _reserved(self) -> int:
        return self.fontMetrics().horizontalAdvance(self.reserve) + 2 if self.reserve else 0

    def sizeHint(self) -> QSize:
        s = super().sizeHint()
        return QSize(max(s.width(), self._reserved()), s.height())

    def minimumSizeHint(self) -> QSize:
        s = super().minimumSizeHint()
        return QSize(max(s.width(), self._reserved()), s.height())


class FigureCard(QFrame):
    """One figure: what it is (never cut), its value and source, where it comes from (the
    run and job, or the device; left out when empty), and (``set_stale``) a note when the
    project has changed since. ``value`` and ``badge`` can be set again (a card that is
    filled in when its figure is known: ``reserve`` is the widest value it will show). The
    card is never narrower than its title, its value and its badge side by side."""

    def __init__(
        self,
        title: str,
        value: str,
        source: str,
        where: str = "",
        note: str = "",
        parent: QWidget | None = None,
        reserve: str = "",
    ):
        super().__init__(parent)
        self.setProperty("role", "card")
        lay = QVBoxLayout(self)
        lay.setContentsMargins(10, 8, 10, 8)
        lay.setSpacing(2)
        self.title = label(title, "muted")  # one line: the card is never narrower than it
        lay.addWidget(self.title)
        row = QHBoxLayout()
        self.value = ValueLabel(value, reserve)
        row.addWidget(self.value)
        row.addStretch(1)
        self.badge = SourceBadge(source, note)
        row.addWidget(self.badge, 0, Qt.AlignmentFlag.AlignVCenter)
        lay.addLayout(row)
        self.where = label(where, "muted", wrap=True)
        lay.addWidget(self.where)
        if not where:
            self.where.hide()
        self.stale_label = label("", wrap=True)
        self.stale_label.setStyleSheet(f"color: {STALE_COLOR};")
        self.stale_label.hide()
        lay.addWidget(self.stale_label)
        lay.addStretch(1)
        if note:
            self.setToolTip(note)

    def minimumSizeHint(self) -> QSize:
        need = super().minimumSizeHint()  # the layout's: the title, the value and its badge
        return QSize(max(MIN_CARD_WIDTH, need.width()), need.height())

    def clip_text(self) -> str:
        return f"{self.title.text()}: {self.value.text()}"

    @property
    def stale(self) -> bool:
        return not self.stale_label.isHidden()

    def set_stale(self, text: str) -> None:
        """Mark the card stale with ``text`` ("" clears it)."""
        self.stale_label.setText(f"⚠ {text}" if text else "")
        self.stale_label.setVisible(bool(text))


class CardGrid(QWidget):
    """Cards in as many equal columns as fit the width (at least one); its minimum width is
    one card's, so a scroll area around it never needs to scroll sideways."""

    def __init__(self, min_card_width: int = MIN_CARD_WIDTH, spacing: int = 8, parent=None):
        super().__init__(parent)
        self.min_card_width = min_card_width
        self.grid = QGridLayout(self)
        self.grid.setContentsMargins(0, 0, 0, 0)
        self.grid.setSpacing(spacing)
        # the layout must not make the widget as wide as the current columns need
        self.grid.setSizeConstraint(QLayout.SizeConstraint.SetNoConstraint)
        self.cards: list[QWidget] = []
        self.columns = 0

    def card_width(self) -> int:
        """The width every column needs: the widest card's minimum."""
        return max([self.min_card_width] + [c.minimumSizeHint().width() for c in self.cards])

    def columns_for(self, width: int) -> int:
        sp = self.grid.spacing()
        n = (width + sp) // (self.card_width() + sp)
        return max(1, min(n, len(self.cards) or 1))

    def set_cards(self, cards: list[QWidget]) -> None:
        for c in self.cards:
            self.grid.removeWidget(c)
            c.deleteLater()
        self.cards = list(cards)
        self.columns = 0
        self._relayout(self.width())

    def _relayout(self, width: int) -> None:
        cols = self.columns_for(width)
        if cols == self.columns:
            return
        for c in self.cards:
            self.grid.removeWidget(c)
        for i, c in enumerate(self.cards):
            self.grid.addWidget(c, i // cols, i % cols)
        for c in range(max(cols, self.columns, 1) + 1):
            self.grid.setColumnStretch(c, 1 if c < cols else 0)
        self.columns = cols
        self.updateGeometry()

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._relayout(event.size().width())

    def event(self, event) -> bool:
        # a card's value grew (a figure filled in): as many columns as still fit
        if event.type() == QEvent.Type.LayoutRequest and self.cards:
            self._relayout(self.width())
        return super().event(event)

    def minimumSizeHint(self) -> QSize:
        return QSize(self.card_width() if self.cards else 0, self.grid.minimumSize().height())

    def sizeHint(self) -> QSize:
        return QSize(self.card_width(), self.grid.sizeHint().height())
