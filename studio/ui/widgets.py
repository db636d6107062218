"""Small shared widgets: source badges, empty states, elided labels, tables, and
``clear_layout`` (notifications are in :mod:`studio.ui.notifications`). The figure card and its grid are in :mod:`studio.ui.pages.cards`."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QRect, QSize, Qt, Signal
from PySide6.QtGui import QColor, QPainter
from PySide6.QtWidgets import (
    QApplication,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QSizePolicy,
    QSplitter,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionProgressBar,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from studio.core.catalog import load_catalog
from studio.core.lazyimport import lazy_module
from studio.core.units import format_bytes
from studio.ui.theme import SOURCE_COLORS, SOURCE_TIPS

pg = lazy_module("pyqtgraph")


def theme_plot(plot, palette) -> None:
    """A pyqtgraph plot in the palette's colours (background, axes and their text): call it
    when the plot is built and on every palette change (theme switch, system light/dark)."""
    plot.setBackground(palette.base().color())
    fg = palette.text().color()
    for axis in ("left", "bottom"):
        ax = plot.getAxis(axis)
        ax.setPen(fg)
        ax.setTextPen(fg)


def plot_message(plot, text: str) -> None:
    """An empty chart says why it is empty instead of drawing bare 0-1 axes: clears ``plot``,
    hides its axes and writes ``text`` in the middle (:func:`plot_axes` brings them back)."""
    plot.clear()
    item = plot.getPlotItem()
    hidden = set(filter(None, (plot.property("message_hid") or "").split(",")))  # shown before
    hidden |= {a for a in ("left", "bottom") if item.getAxis(a).isVisible()}
    for a in hidden:
        item.hideAxis(a)
    plot.setProperty("message_hid", ",".join(sorted(hidden)))
    msg = pg.TextItem(text, anchor=(0.5, 0.5), color=plot.palette().text().color())
    msg.is_plot_message = True
    # a long reason wraps (centred) to the chart's width instead of running off its sides
    doc = msg.textItem.document()
    option = doc.defaultTextOption()
    option.setAlignment(Qt.AlignmentFlag.AlignHCenter)
    doc.setDefaultTextOption(option)
    if msg.textItem.boundingRect().width() > plot.width() * 0.85:
        msg.setTextWidth(max(160, int(plot.width() * 0.85)))
    plot.addItem(msg)
    msg.setPos(0.5, 0.5)
    plot.setXRange(0, 1, padding=0)
    plot.setYRange(0, 1, padding=0)
    plot.setProperty("message", text)


def plot_axes(plot) -> None:
    """Undo :func:`plot_message` before drawing data: the axes it hid are shown again, and
    the ranges it fixed follow the data again (a chart that showed no message keeps its
    zoom)."""
    hid = plot.property("message_hid") or ""
    for a in filter(None, hid.split(",")):
        plot.getPlotItem().showAxis(a)
    if plot.property("message"):
        for item in plot.getPlotItem().items[:]:
            if getattr(item, "is_plot_message", False):
                plot.removeItem(item)
        plot.getPlotItem().enableAutoRange()
    plot.setProperty("message_hid", "")
    plot.setProperty("message", "")


def label(
    text: str = "", role: str | None = None, wrap: bool = False, selectable: bool = False
) -> QLabel:
    w = QLabel(text)
    if role:
        w.setProperty("role", role)
    w.setWordWrap(wrap)
    if selectable:
        w.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    return w


class SourceBadge(QLabel):
    """A coloured pill naming where a number comes from (measured, simulated, ...)."""

    def __init__(self, source: str, detail: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self.set_source(source, detail)

    def set_source(self, source: str, detail: str = "") -> None:
        self.source = source
        color = SOURCE_COLORS.get(source, "#5b6570")
        self.setText(source)
        self.setStyleSheet(
            f"QLabel {{ background: {color}; color: white; border-radius: 8px; "
            "padding: 1px 7px; font-size: 8.5pt; font-weight: 600; }"
        )
        tip = SOURCE_TIPS.get(source, "")
        self.setToolTip(f"{tip}\n{detail}".strip())
        self.setSizePolicy(QSizePolicy.Policy.Fixed, QSizePolicy.Policy.Fixed)


def badge_html(source: str) -> str:
    color = SOURCE_COLORS.get(source, "#5b6570")
    return (
        f'<span style="background:{color}; color:white; font-weight:600;">'
        f"&nbsp;{source}&nbsp;</span>"
    )


def clear_layout(layout, hide: bool = False) -> None:
    """Remove everything in ``layout`` (nested layouts emptied too) and delete it once the
    event loop runs. ``hide``: hide each widget at once too (else it stays drawn until then,
    so a page that refills the layout never shows a gap)."""
    while layout.count():
        item = layout.takeAt(0)
        w = item.widget()
        if w is not None:
            if hide:
                w.hide()
            w.deleteLater()
        elif item.layout() is not None:
            clear_layout(item.layout(), hide)


class ElidedLabel(QLabel):
    """One line of text elided (``…``) to the width the layout gives it, never asking for
    more: its whole text is in its tool tip. A click emits ``clicked``."""

    clicked = Signal()

    def __init__(self, text: str = "", parent: QWidget | None = None):
        super().__init__(parent)
        self._full = ""
        self.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.set_full_text(text)

    def full_text(self) -> str:
        return self._full

    def set_full_text(self, text: str, tip: str | None = None) -> None:
        self._full = " ".join(text.split())  # one line
        self.setToolTip(text if tip is None else tip)
        self._elide()

    def _elide(self) -> None:
        width = max(0, self.contentsRect().width())
        self.setText(self.fontMetrics().elidedText(self._full, Qt.TextElideMode.ElideRight,
                                                   width))

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        self._elide()

    def minimumSizeHint(self) -> QSize:
        return QSize(0, super().minimumSizeHint().height())

    def sizeHint(self) -> QSize:
        return QSize(self.fontMetrics().horizontalAdvance(self._full) + 2,
                     super().sizeHint().height())

    def mouseReleaseEvent(self, event) -> None:
        super().mouseReleaseEvent(event)
        if event.button() == Qt.MouseButton.LeftButton:
            self.clicked.emit()


class EmptyState(QWidget):
    """What will appear here, and how to get it: a title, a text and real actions."""

    def __init__(self, title: str, text: str, parent: QWidget | None = None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.addStretch(1)
        self.title = label(title, "empty-title")
        self.title.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        self.text = label(text, "empty-text", wrap=True)
        self.text.setAlignment(Qt.AlignmentFlag.AlignHCenter)
        self.text.setMaximumWidth(620)
        self.text.setTextFormat(Qt.TextFormat.RichText)
        lay.addWidget(self.title)
        lay.addSpacing(6)
        row = QHBoxLayout()
        row.addStretch(1)
        row.addWidget(self.text)
        row.addStretch(1)
        lay.addLayout(row)
        self.buttons = QHBoxLayout()
        self.buttons.addStretch(1)
        self.buttons.addStretch(1)
        lay.addSpacing(10)
        lay.addLayout(self.buttons)
        lay.addStretch(2)

    def set_text(self, title: str, text: str) -> None:
        self.title.setText(title)
        self.text.setText(text)

    def add_action(self, text: str, slot: Callable[[], object], tip: str = "") -> QPushButton:
        b = QPushButton(text)
        b.setToolTip(tip)
        b.clicked.connect(lambda: slot())
        self.buttons.insertWidget(self.buttons.count() - 1, b)
        return b


class ProgressDelegate(QStyledItemDelegate):
    """Paints a float in [0, 1] (UserRole) as a progress bar."""

    def paint(self, painter, option, index):
        value = index.data(Qt.ItemDataRole.UserRole)
        if value is None:
            super().paint(painter, option, index)
            return
        bar = QStyleOptionProgressBar()
        r = option.rect
        bar.rect = QRect(r.x() + 3, r.y() + 4, r.width() - 6, r.height() - 8)
        bar.minimum, bar.maximum = 0, 100
        bar.progress = int(round(float(value) * 100))
        bar.text = index.data(Qt.ItemDataRole.DisplayRole) or ""
        bar.textVisible = True
        bar.textAlignment = Qt.AlignmentFlag.AlignCenter
        # Qt 6 dropped the bar's orientation field: without State_Horizontal the style
        # draws a vertical bar that fills bottom to top.
        bar.state = (
            option.state | QStyle.StateFlag.State_Enabled | QStyle.StateFlag.State_Horizontal
        )
        bar.palette = option.palette
        style = option.widget.style() if option.widget else QApplication.style()
        style.drawControl(QStyle.ControlElement.CE_ProgressBar, bar, painter, option.widget)

    def sizeHint(self, option, index):
        return QSize(110, 24)


def human_bytes(n: float) -> str:
    """A byte size in binary units (``studio.core.units.format_bytes``)."""
    return format_bytes(int(n))


def human_count(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.2f} B"
    if n >= 1e6:
        return f"{n / 1e6:.2f} M"
    if n >= 1e3:
        return f"{n / 1e3:.1f} K"
    return str(n)


def fmt_value(value: float, unit: str = "") -> str:
    if unit == "B":  # a byte count (the compiler's figures, sizes)
        return format_bytes(int(value))
    if unit == "fraction":
        return f"{value:.1%}"
    if unit in ("ms", "s"):
        return f"{value:.3g} {unit}"
    if abs(value) >= 1000:
        text = f"{value:,.0f}"
    else:
        text = f"{value:.4g}"
    return f"{text} {unit}".strip()


def fmt_seconds(s: float | None) -> str:
    if s is None:
        return ""
    if s < 60:
        return f"{s:.1f} s"
    m, sec = divmod(int(s), 60)
    if m < 60:
        return f"{m}:{sec:02d} min"
    h, m = divmod(m, 60)
    return f"{h}:{m:02d}:{sec:02d} h"


class BadgeDelegate(QStyledItemDelegate):
    """Paints a cell whose text is a source name (measured, simulated...) as a coloured pill."""

    def paint(self, painter, option, index):
        text = index.data(Qt.ItemDataRole.DisplayRole) or ""
        if text not in SOURCE_COLORS:
            super().paint(painter, option, index)
            return
        if option.state & QStyle.StateFlag.State_Selected:
            painter.fillRect(option.rect, option.palette.highlight())
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing)
        fm = option.fontMetrics
        w = fm.horizontalAdvance(text) + 14
        h = fm.height() + 2
        r = option.rect
        rect = QRect(r.x() + 4, r.y() + (r.height() - h) // 2, w, h)
        painter.setPen(Qt.PenStyle.NoPen)
        painter.setBrush(QColor(SOURCE_COLORS[text]))
        painter.drawRoundedRect(rect, h / 2, h / 2)
        painter.setPen(QColor("white"))
        painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, text)
        painter.restore()

    def sizeHint(self, option, index):
        s = super().sizeHint(option, index)
        return QSize(s.width() + 16, s.height())


class ChipList(QListWidget):
    """The chip catalog as a checklist (tooltips carry each chip's notes and numerics
    warnings); ``checked()`` / ``set_checked()`` speak catalog keys."""

    def __init__(self, checked: list[str], parent: QWidget | None = None):
        super().__init__(parent)

        self.setSpacing(1)  # the check boxes of neighbouring chips do not touch
        for key, chip in load_catalog().items():
            item = QListWidgetItem(f"{chip.label}   [{key}]")
            item.setData(Qt.ItemDataRole.UserRole, key)
            item.setToolTip("\n".join([chip.notes, *chip.warnings()]).strip())
            self.addItem(item)
        self.set_checked(checked)

    def checked(self) -> list[str]:
        return [
            self.item(i).data(Qt.ItemDataRole.UserRole)
            for i in range(self.count())
            if self.item(i).checkState() == Qt.CheckState.Checked
        ]

    def set_checked(self, keys: list[str]) -> None:
        for i in range(self.count()):
            item = self.item(i)
            on = item.data(Qt.ItemDataRole.UserRole) in keys
            item.setCheckState(Qt.CheckState.Checked if on else Qt.CheckState.Unchecked)


def splitter(orientation: Qt.Orientation, first: QWidget, second: QWidget,
             stretch: tuple[int, int] = (1, 1), sizes: tuple[int, int] | None = None
             ) -> QSplitter:
    """Two panes that never collapse, with their stretch factors (and starting sizes)."""
    split = QSplitter(orientation)
    split.setChildrenCollapsible(False)
    split.addWidget(first)
    split.addWidget(second)
    split.setStretchFactor(0, stretch[0])
    split.setStretchFactor(1, stretch[1])
    if sizes is not None:
        split.setSizes(list(sizes))
    return split


def read_only_table(headers: list[str], stretch: int | None = None) -> QTableWidget:
    """A read-only table with these column headers, sized to its contents; column
    ``stretch`` (default the last) takes the remaining width."""
    t = QTableWidget(0, len(headers))
    t.setHorizontalHeaderLabels(headers)
    t.verticalHeader().hide()
    t.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
    t.setAlternatingRowColors(True)
    hh = t.horizontalHeader()
    hh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    if stretch is None:
        hh.setStretchLastSection(True)
    else:
        hh.setSectionResizeMode(stretch, QHeaderView.ResizeMode.Stretch)
    return t


def fill_table(table: QTableWidget, rows: list[list[str]], tips: list[str] | None = None,
               fit_rows: bool = False) -> None:
    """Put ``rows`` of text in ``table``; each row's tool tip is ``tips[i]`` (default: each
    cell's own text); ``fit_rows``: rows as tall as their wrapped text."""
    table.setRowCount(len(rows))
    for i, row in enumerate(rows):
        for j, text in enumerate(row):
            item = QTableWidgetItem(text)
            item.setToolTip(tips[i] if tips else text)
            table.setItem(i, j, item)
    if fit_rows:
        table.resizeRowsToContents()
