"""The clip check: every text under a window that is cut short, for the screenshot tests.

``clipped_texts(root)`` looks at the shown widgets under ``root`` and reports each text that
does not fit the part of its widget one can see (a widget is cut by its parents too: a card
wider than the row it sits in is cut at the row's edge; inside a scroll area, scrolling
shows the rest, so the viewport does not cut):

- a label that does not wrap, narrower than its text; one that wraps, shorter than its
  lines (an :class:`~studio.ui.widgets.ElidedLabel` elides by design: its tool tip must
  hold the whole text);
- a button narrower than its text, icon and padding; a check box or radio button narrower
  than its size hint; a group box narrower than its title;
- a search or line edit narrower than its placeholder (while empty), a combo box whose
  field is narrower than the current item;
- a list item (list views: navigation, chips, samples) cut at the list's edge without a
  tool tip that carries its text;
- a widget of the studio's own (a legend, a card, a card grid) given less than its minimum
  width: what it paints is cut;
- in a chart: an axis title longer than its axis, a title wider than the chart, and a
  message that runs past the plot area.

Each as ``"ClassName 'text' width < needed"``.
"""

from __future__ import annotations

from PySide6.QtCore import QPoint, QRect, Qt
from PySide6.QtWidgets import (
    QAbstractButton,
    QAbstractScrollArea,
    QCheckBox,
    QComboBox,
    QGroupBox,
    QLabel,
    QLineEdit,
    QListView,
    QRadioButton,
    QStyle,
    QStyleOptionComboBox,
    QWidget,
)

from studio.core.lazyimport import lazy_module
from studio.ui.widgets import ElidedLabel

pg = lazy_module("pyqtgraph")


def _seen(w: QWidget, root: QWidget) -> QRect:
    """The part of ``w`` one can see, in ``root``'s coordinates: its rectangle cut by each
    parent's up to ``root`` (a scroll area's viewport does not cut: it scrolls)."""
    r = QRect(w.mapTo(root, QPoint(0, 0)), w.size())
    p = w.parentWidget()
    while p is not None:
        owner = p.parentWidget()
        if isinstance(owner, QAbstractScrollArea) and p is owner.viewport():
            break
        r &= QRect(p.mapTo(root, QPoint(0, 0)), p.size())
        if p is root:
            break
        p = owner
    return r


def _name(w: QWidget, text: str) -> str:
    return f"{type(w).__name__} {text[:60]!r}"


def _label(w: QLabel, width: int, out: list[str]) -> None:
    pix = w.pixmap()
    if not w.text().strip() or (pix is not None and not pix.isNull()):
        return
    if isinstance(w, ElidedLabel):
        if w.text() != w.full_text() and w.full_text() not in w.toolTip():
            out.append(f"{_name(w, w.full_text())} elided without its text in a tool tip")
        return
    if w.wordWrap():  # wraps: its last lines cut off below (a card too short)
        tall = w.heightForWidth(w.width())
        if tall > w.height() + 2:
            out.append(f"{_name(w, w.text())} height {w.height()} < {tall}")
        return
    need = w.sizeHint().width()
    if width + 1 < need:
        out.append(f"{_name(w, w.text())} {width} < {need}")


def _button(w: QAbstractButton, width: int, out: list[str]) -> None:
    if not w.text().strip():
        return
    if isinstance(w, (QCheckBox, QRadioButton)):
        need = w.sizeHint().width()
    else:
        need = w.fontMetrics().horizontalAdvance(w.text().replace("&", "")) + 8
        if not w.icon().isNull():
            need += w.iconSize().width() + 4
    if width + 1 < need:
        out.append(f"{_name(w, w.text())} {width} < {need}")


def _group_box(w: QGroupBox, width: int, out: list[str]) -> None:
    if not w.title().strip():
        return
    need = w.fontMetrics().horizontalAdvance(w.title().replace("&", "")) + 16
    if w.isCheckable():
        need += w.style().pixelMetric(QStyle.PixelMetric.PM_IndicatorWidth) + 6
    if width + 1 < need:
        out.append(f"{_name(w, w.title())} {width} < {need}")


def _line_edit(w: QLineEdit, width: int, out: list[str]) -> None:
    text = w.placeholderText()
    if w.text() or not text.strip():
        return  # typed text scrolls in its box
    m = w.textMargins()
    need = w.fontMetrics().horizontalAdvance(text) + m.left() + m.right() + 12
    if width + 1 < need:
        out.append(f"{_name(w, text)} {width} < {need}")


def _combo(w: QComboBox, width: int, out: list[str]) -> None:
    text = w.currentText()
    if not text.strip() or w.isEditable():
        return
    opt = QStyleOptionComboBox()
    w.initStyleOption(opt)
    field = w.style().subControlRect(QStyle.ComplexControl.CC_ComboBox, opt,
                                     QStyle.SubControl.SC_ComboBoxEditField, w).width()
    field -= w.width() - width  # the part of the box its parents cut
    need = w.fontMetrics().horizontalAdvance(text) + 4
    if not w.itemIcon(w.currentIndex()).isNull():
        need += w.iconSize().width() + 4
    if field + 1 < need:
        out.append(f"{_name(w, text)} field {field} < {need}")


def _list_items(w: QListView, out: list[str]) -> None:
    model = w.model()
    if model is None or w.horizontalScrollBar().isVisible():
        return
    port = w.viewport()
    fm = w.fontMetrics()
    for row in range(min(model.rowCount(w.rootIndex()), 500)):
        if w.isRowHidden(row):
            continue
        idx = model.index(row, w.modelColumn(), w.rootIndex())
        rect = w.visualRect(idx)
        if not rect.intersects(port.rect()):
            continue
        text = str(idx.data(Qt.ItemDataRole.DisplayRole) or "")
        if not text.strip():
            continue
        tip = str(idx.data(Qt.ItemDataRole.ToolTipRole) or "")
        if text in tip:
            continue  # cut or elided, its text is a hover away
        need = fm.horizontalAdvance(text) + 12
        if idx.data(Qt.ItemDataRole.CheckStateRole) is not None:
            need += w.style().pixelMetric(QStyle.PixelMetric.PM_IndicatorWidth) + 8
        if idx.data(Qt.ItemDataRole.DecorationRole) is not None:
            need += w.iconSize().width() + 4
        seen = min(rect.right(), port.width() - 1) - max(rect.left(), 0) + 1
        if seen + 1 < need:
            out.append(f"{type(w).__name__} item {text[:60]!r} {seen} < {need}")


def _own(w: QWidget, width: int, out: list[str]) -> None:
    """A widget of the studio's own (it paints its text, or holds cards) given less than
    its minimum width."""
    need = w.minimumSizeHint().width()
    if need > 0 and width + 1 < need:
        text = getattr(w, "clip_text", lambda: "")()
        out.append(f"{_name(w, text)} {width} < {need}")


def _charts(w: QWidget, out: list[str]) -> None:
    """An axis title longer than its axis, a title wider than the chart, a message that
    runs past the plot area (a pyqtgraph PlotWidget)."""
    item = w.getPlotItem()
    name = type(w).__name__
    for side in ("left", "right", "top", "bottom"):
        axis = item.getAxis(side)
        if not axis.isVisible() or not axis.label.isVisible() or not axis.labelText:
            continue
        length = axis.geometry().height() if side in ("left", "right") else \
            axis.geometry().width()
        need = axis.label.boundingRect().width()
        if length + 1 < need:
            out.append(f"{name} {side} axis {axis.labelText[:60]!r} {length:.0f} < {need:.0f}")
    title = item.titleLabel
    if title.isVisible() and title.text:
        need = title.item.boundingRect().width()
        if item.geometry().width() + 1 < need:
            out.append(f"{name} title {title.text[:60]!r} {item.geometry().width():.0f} < "
                       f"{need:.0f}")
    view = item.getViewBox().sceneBoundingRect()
    for it in item.items:
        if getattr(it, "is_plot_message", False) and it.isVisible():
            drawn = it.sceneBoundingRect()
            if not view.adjusted(-1, -1, 1, 1).contains(drawn):
                out.append(f"{name} message {it.toPlainText()[:60]!r} {view.width():.0f} < "
                           f"{drawn.width():.0f}")


def clipped_texts(root: QWidget) -> list[str]:
    """Every text cut short under ``root`` (shown widgets only); see the module's text."""
    out: list[str] = []
    for w in root.findChildren(QWidget):
        if not w.isVisibleTo(root) or w.width() <= 0:
            continue
        width = _seen(w, root).width()
        if isinstance(w, QLabel):
            _label(w, width, out)
        elif isinstance(w, QAbstractButton):
            _button(w, width, out)
        elif isinstance(w, QGroupBox):
            _group_box(w, width, out)
        elif isinstance(w, QLineEdit):
            _line_edit(w, width, out)
        elif isinstance(w, QComboBox):
            _combo(w, width, out)
        elif isinstance(w, QListView):
            _list_items(w, out)
        elif isinstance(w, pg.PlotWidget):
            _charts(w, out)
        elif type(w).__module__.startswith("studio."):
            _own(w, width, out)
    return out
