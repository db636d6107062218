"""The layer grid: every layer the recipe can set, as transformer blocks × module kinds.

Each cell shows its weight and activation precision (``W8 A16``; ``A16`` for a layer without
weights, ``FP16`` for a float layer), coloured by precision — or, with the heat map on, by
the layer's sensitivity. A corner mark says a rule of the project (not the scheme) set it;
the tooltip names the layer and both rules. A click selects a cell, a header click a whole
column or block; the context menu sets the selection's precision (choices the targets' HTP
cannot run are shown disabled, with the reason).

The grid never edits the project: it asks (``edit_requested``) and the page turns the ask
into override rules (:mod:`studio.services.precision_edit`), one undoable edit.
"""

from __future__ import annotations

from PySide6.QtCore import QItemSelection, QItemSelectionModel, QPointF, QRect, QSize, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QLinearGradient, QPainter, QPen, QPolygonF
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QMenu,
    QStyle,
    QStyledItemDelegate,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from studio.core.recipe import FLOAT_PRECISIONS, PART_TITLES, PARTS, PRECISIONS, refusal
from studio.ui.models.layergrid import (
    HEAT_HIGH,
    HEAT_LOW,
    HEAT_NONE,
    PRECISION_COLORS,
    PRECISION_HELP,
    HeatLevelRole,
    LayerGridModel,
    LayerRole,
    overridden,
    short,
)
from studio.ui.theme import mix

TEXT_DARK, TEXT_LIGHT = QColor("#1d2025"), QColor("#ffffff")
OVERRIDE_MARK = QColor("#1f5bbf")


class CellDelegate(QStyledItemDelegate):
    """Paints a cell: weight and activation halves in their precision colours (or one fill
    for a float layer or a layer without weights), the heat colour in heat mode, a corner
    mark when a rule set it, a frame when selected."""

    def paint(self, painter: QPainter, option, index) -> None:
        row = index.data(LayerRole)
        if row is None:
            return
        model = index.model()
        rect = option.rect.adjusted(1, 1, -1, -1)
        painter.save()
        painter.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        font = option.font
        font.setPointSizeF(max(7.5, font.pointSizeF() - 0.5))
        painter.setFont(font)
        w, a = row["weight"], row["activation"]
        if getattr(model, "heat_on", False):
            level = index.data(HeatLevelRole)
            fill = HEAT_NONE if level is None else mix(HEAT_LOW, HEAT_HIGH, level)
            painter.fillRect(rect, fill)
            painter.setPen(TEXT_LIGHT if level is not None and level > 0.55 else TEXT_DARK)
            painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, index.data())
        elif w and not (a in FLOAT_PRECISIONS and w == a):
            left = QRect(rect.x(), rect.y(), rect.width() // 2, rect.height())
            right = QRect(left.right() + 1, rect.y(), rect.width() - left.width(), rect.height())
            painter.fillRect(left, QColor(PRECISION_COLORS.get(w, "#cccccc")))
            painter.fillRect(right, QColor(PRECISION_COLORS.get(a, "#cccccc")))
            painter.setPen(TEXT_DARK)
            painter.drawText(left, Qt.AlignmentFlag.AlignCenter, f"W{short(w)}")
            painter.drawText(right, Qt.AlignmentFlag.AlignCenter, f"A{short(a)}")
        else:
            painter.fillRect(rect, QColor(PRECISION_COLORS.get(a, "#cccccc")))
            painter.setPen(TEXT_DARK)
            painter.drawText(rect, Qt.AlignmentFlag.AlignCenter, index.data())
        if overridden(row):
            s = min(9, rect.height() // 3)
            tr = rect.topRight()
            painter.setRenderHint(QPainter.RenderHint.Antialiasing, True)
            painter.setPen(Qt.PenStyle.NoPen)
            painter.setBrush(OVERRIDE_MARK)
            painter.drawPolygon(QPolygonF([QPointF(tr.x() - s + 1, tr.y()),
                                           QPointF(tr.x() + 1, tr.y()),
                                           QPointF(tr.x() + 1, tr.y() + s)]))
        if option.state & QStyle.StateFlag.State_Selected:
            painter.setRenderHint(QPainter.RenderHint.Antialiasing, False)
            painter.setBrush(Qt.BrushStyle.NoBrush)
            painter.setPen(QPen(option.palette.highlight().color(), 3))
            painter.drawRect(rect.adjusted(1, 1, -1, -1))
        painter.restore()

    def sizeHint(self, option, index) -> QSize:
        return QSize(50, 30)


class PrecisionLegend(QWidget):
    """Swatches of the precision colours, the override mark and what W / A mean; in heat mode
    a colour scale from no gain to the largest, with the figure's name and source. Its
    entries flow onto a second line where the row is too narrow for one (never cut)."""

    LINE = 26  # px per line
    GAP = 12  # px between entries
    SCALE = 140  # px of the heat scale

    def __init__(self, parent=None):
        super().__init__(parent)
        self.heat_text = ""
        self.heat_max = 0.0
        self.heat_on = False
        policy = self.sizePolicy()
        policy.setHeightForWidth(True)
        self.setSizePolicy(policy)
        tips = [f"{p}: {PRECISION_HELP[p]}" for p in PRECISIONS]
        self.setToolTip("\n".join(tips) + "\nA corner mark: set by an override rule")

    def set_heat(self, on: bool, vmax: float = 0.0, text: str = "") -> None:
        self.heat_on, self.heat_max, self.heat_text = on, vmax, text
        self.updateGeometry()
        self.update()

    def clip_text(self) -> str:
        return "  ".join(text for _kind, _fill, text in self.entries())

    def entries(self) -> list[tuple[str, object, str]]:
        """What the legend shows, in order: ``(kind, fill, text)``; kind "swatch" (a square
        of ``fill``), "mark" (the override mark), "scale" (0, the heat scale, the top
        value) or "text"."""
        if self.heat_on:
            return [("text", None, "sensitivity:"),
                    ("scale", None, f"{self.heat_max:.3g} {self.heat_text}".strip()),
                    ("swatch", HEAT_NONE, "not analysed")]
        return ([("swatch", QColor(PRECISION_COLORS[p]), p) for p in PRECISIONS]
                + [("mark", OVERRIDE_MARK, "set by a rule"),
                   ("text", None, "W weights, A activations")])

    def _entry_width(self, kind: str, text: str) -> int:
        fm = self.fontMetrics()
        lead = {"swatch": 18, "mark": 14, "text": 0,
                "scale": fm.horizontalAdvance("0") + 4 + self.SCALE + 4}[kind]
        return lead + fm.horizontalAdvance(text)

    def _lines(self, width: int) -> list[list[tuple[str, object, str]]]:
        lines: list[list[tuple[str, object, str]]] = [[]]
        x = 2
        for e in self.entries():
            w = self._entry_width(e[0], e[2])
            if lines[-1] and x + w > width:
                lines.append([])
                x = 2
            lines[-1].append(e)
            x += w + self.GAP
        return lines

    def paintEvent(self, _event) -> None:
        p = QPainter(self)
        p.setRenderHint(QPainter.RenderHint.Antialiasing, True)
        fm = p.fontMetrics()
        text_pen = self.palette().windowText().color()
        for n, line in enumerate(self._lines(self.width())):
            top = n * self.LINE
            y = top + (self.LINE - 14) // 2
            x = 2
            for kind, fill, text in line:
                p.setPen(Qt.PenStyle.NoPen)
                if kind == "swatch":
                    p.setBrush(fill)
                    p.drawRect(x, y, 14, 14)
                    x += 18
                elif kind == "mark":
                    p.setBrush(fill)
                    p.drawPolygon(QPolygonF([QPointF(x, y), QPointF(x + 10, y),
                                             QPointF(x + 10, y + 10)]))
                    x += 14
                elif kind == "scale":
                    p.setPen(text_pen)
                    p.drawText(x, top, fm.horizontalAdvance("0"), self.LINE,
                               Qt.AlignmentFlag.AlignVCenter, "0")
                    x += fm.horizontalAdvance("0") + 4
                    grad = QLinearGradient(x, 0, x + self.SCALE, 0)
                    grad.setColorAt(0.0, HEAT_LOW)
                    grad.setColorAt(1.0, HEAT_HIGH)
                    p.setPen(Qt.PenStyle.NoPen)
                    p.setBrush(QBrush(grad))
                    p.drawRect(x, y, self.SCALE, 14)
                    x += self.SCALE + 4
                p.setPen(text_pen)
                tw = fm.horizontalAdvance(text)
                p.drawText(x, top, tw, self.LINE, Qt.AlignmentFlag.AlignVCenter, text)
                x += tw + self.GAP

    def hasHeightForWidth(self) -> bool:
        return True

    def heightForWidth(self, width: int) -> int:
        return self.LINE * len(self._lines(width))

    def sizeHint(self) -> QSize:
        one = sum(self._entry_width(k, t) + self.GAP for k, _f, t in self.entries())
        return QSize(one + 2, self.LINE)

    def minimumSizeHint(self) -> QSize:
        widest = max(self._entry_width(k, t) for k, _f, t in self.entries())
        return QSize(widest + 4, self.LINE)

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if self.heightForWidth(event.size().width()) != event.size().height():
            self.updateGeometry()


class LayerGrid(QWidget):
    """The grid view, its legend and its context menu."""

    #: the selected layers changed (names, in model order)
    selection_changed = Signal(list)
    #: the user picked a precision for the selection: (part, precision); part "scheme": back
    #: to the scheme's precisions
    edit_requested = Signal(str, str)
    #: the user asked to see a layer in the graph view (its module path)
    graph_requested = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.model = LayerGridModel(self)
        self.view = QTableView()
        self.view.setModel(self.model)
        self.view.setItemDelegate(CellDelegate(self.view))
        self.view.setShowGrid(False)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectItems)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.view.setMouseTracking(True)
        self.view.setCornerButtonEnabled(False)
        hh = self.view.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        hh.setMinimumSectionSize(48)
        small = hh.font()
        small.setPointSizeF(max(7.0, small.pointSizeF() - 1.0))
        hh.setFont(small)
        hh.setDefaultAlignment(Qt.AlignmentFlag.AlignCenter)
        vh = self.view.verticalHeader()
        vh.setSectionResizeMode(QHeaderView.ResizeMode.Fixed)
        vh.setDefaultSectionSize(30)
        self.view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.view.customContextMenuRequested.connect(self._menu)
        self.view.selectionModel().selectionChanged.connect(
            lambda *_: self.selection_changed.emit(self.selected_layers()))
        self.model.modelReset.connect(self._reset)
        lay.addWidget(self.view, 1)
        self.legend = PrecisionLegend()
        #: the legend's row (the legend flows onto a second line where it must)
        self.legend_row = QHBoxLayout()
        self.legend_row.setContentsMargins(0, 2, 0, 0)
        self.legend_row.addWidget(self.legend, 1)
        lay.addLayout(self.legend_row)
        #: for the context menu's refusals: () -> (chips, scheme)
        self.context = lambda: ((), None)

    def _reset(self) -> None:
        self.fit_height()
        self.selection_changed.emit(self.selected_layers())

    def fit_height(self) -> None:
        """No taller than its rows (a small model leaves the rest of the pane to the legend
        and the heat map); a deep model scrolls."""
        v = self.view
        v.resizeColumnsToContents()
        h = v.horizontalHeader().sizeHint().height() + 2 * v.frameWidth()
        h += sum(v.rowHeight(r) for r in range(self.model.rowCount()))
        wide = sum(v.columnWidth(c) for c in range(self.model.columnCount()))
        wide += v.verticalHeader().sizeHint().width() + 2 * v.frameWidth()
        if wide > v.width():  # the sideways scroll bar takes a row's room
            h += v.horizontalScrollBar().sizeHint().height()
        v.setMaximumHeight(max(h + 2, 120))

    def resizeEvent(self, event) -> None:
        super().resizeEvent(event)
        if self.model.rowCount():
            self.fit_height()

    # ---- selection ------------------------------------------------------------------------------
    def selected_layers(self) -> list[str]:
        names = {self.model.layer_at(i) for i in self.view.selectionModel().selectedIndexes()}
        return [n for n in self.model.layers() if n in names]

    def select_layers(self, names: list[str], scroll: bool = True) -> None:
        sel = QItemSelection()
        first = None
        for n in names:
            idx = self.model.index_of(n)
            if idx.isValid():
                sel.select(idx, idx)
                first = first or idx
        flags = QItemSelectionModel.SelectionFlag.ClearAndSelect
        self.view.selectionModel().select(sel, flags)
        if first is not None:
            self.view.selectionModel().setCurrentIndex(
                first, QItemSelectionModel.SelectionFlag.NoUpdate)
            if scroll:
                self.view.scrollTo(first)

    def select_column(self, title: str) -> None:
        """Select every layer of a column (by its key or title), as a header click does."""
        lay = self.model.layout
        col = lay.columns.index(title) if title in lay.columns else lay.titles.index(title)
        self.select_layers([n for n, (_, c) in lay.cells.items() if c == col])

    # ---- heat -----------------------------------------------------------------------------------
    def set_heat(self, values: dict[str, float] | None, text: str = "",
                 floor: float = 0.0) -> None:
        self.model.set_heat(values, text, floor)
        self.legend.set_heat(values is not None, self.model.heat_max, text)
        self.view.viewport().update()

    # ---- context menu -----------------------------------------------------------------------------
    def refusal_of(self, part: str, precision: str) -> str | None:
        """Why the targets' HTP refuses ``precision`` for ``part`` of the selected layers (the
        context menu's and the Precision page's Set row's one rule), or None."""
        rows = [self.model.row_of(n) for n in self.selected_layers()]
        chips, scheme = self.context()
        return refusal(part, precision, has_weight=any(r and r["weight"] for r in rows),
                       chips=chips, scheme=scheme)

    def menu_choices(self) -> list[tuple[str, str, str, str]]:
        """(part, precision, text, refusal or "") of the context menu, for the selection."""
        out = []
        for part in PARTS:
            for prec in PRECISIONS:
                if part == "weights" and prec in FLOAT_PRECISIONS:
                    continue  # never offered: a float layer is the whole layer
                if part == "activations" and prec in FLOAT_PRECISIONS:
                    continue  # the same as the whole layer
                if part == "layer" and prec == "INT4":
                    continue  # refused for the same reason as INT4 activations
                why = self.refusal_of(part, prec)
                text = f"{PART_TITLES[part].capitalize()} → {prec}"
                out.append((part, prec, text, why or ""))
        return out

    def _menu(self, pos) -> None:
        if not self.selected_layers():
            idx = self.view.indexAt(pos)
            if self.model.layer_at(idx) is None:
                return
            self.select_layers([self.model.layer_at(idx)], scroll=False)
        menu = self.build_menu()
        menu.exec(self.view.viewport().mapToGlobal(pos))

    def build_menu(self) -> QMenu:
        n = len(self.selected_layers())
        menu = QMenu(self)
        menu.setToolTipsVisible(True)
        head = menu.addAction(f"{n} layer{'s' if n != 1 else ''} selected")
        head.setEnabled(False)
        last_part = None
        for part, prec, text, why in self.menu_choices():
            if part != last_part:
                menu.addSeparator()
                last_part = part
            # a refused choice stays clickable: the page says why and changes nothing
            act = menu.addAction(text + ("   ✕ refused" if why else ""))
            if why:
                act.setToolTip(why)
            act.triggered.connect(
                lambda _c=False, p=part, q=prec: self.edit_requested.emit(p, q))
        menu.addSeparator()
        back = menu.addAction("Back to the scheme")
        back.setToolTip("Remove the rules that set only these layers (and undo wider ones "
                        "for them)")
        back.triggered.connect(lambda: self.edit_requested.emit("scheme", ""))
        layers = self.selected_layers()
        if len(layers) == 1:
            show = menu.addAction("Show in the graph")
            show.setToolTip("Its nodes in the Model page's drawing of the exported graph")
            show.triggered.connect(lambda: self.graph_requested.emit(layers[0]))
        return menu

