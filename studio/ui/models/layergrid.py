"""The layer grid's model: transformer blocks × module kinds, one cell per layer.

Rows and columns come from :func:`studio.services.precision.grid_layout`; each cell holds a
:func:`studio.services.precision.layer_precisions` row. Refreshing with rows of the same
shape only signals the cells whose precision, rule or heat changed.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, Qt
from PySide6.QtGui import QColor

from studio.core.recipe import FLOAT_PRECISIONS
from studio.core.units import signed
from studio.services.precision import GridLayout, grid_layout
from studio.ui.models.rows import Index, PayloadRole

#: the cell's layer-precision row (dict), or None for a cell without a layer
LayerRole = PayloadRole
#: the heat value of the cell (float), or None
HeatRole = Qt.ItemDataRole.UserRole + 2
#: 0..1 position of the heat value on the legend's scale, or None
HeatLevelRole = Qt.ItemDataRole.UserRole + 3

#: one colour per precision (light fills under dark text, readable on both themes)
PRECISION_COLORS = {
    "INT4": "#f3b8b0",
    "INT8": "#f7dc92",
    "INT16": "#bfe3bf",
    "FP16": "#b6d4f2",
    "FP32": "#d3c6ee",
}
PRECISION_HELP = {
    "INT4": "4-bit integer (weights only)",
    "INT8": "8-bit integer",
    "INT16": "16-bit integer",
    "FP16": "16-bit float (layer kept in float)",
    "FP32": "32-bit float (the HTP runs float layers in FP16)",
}
#: the heat scale: no gain → most sensitive, and the fill of a layer the analysis did not vary
HEAT_LOW, HEAT_HIGH, HEAT_NONE = QColor("#fbf3e4"), QColor("#b3261e"), QColor("#dfe2e6")


def short(precision: str) -> str:
    """``INT8`` -> ``8``, ``FP16`` -> ``FP16``."""
    return precision[3:] if precision.startswith("INT") else precision


def cell_text(row: dict[str, Any]) -> str:
    """``W8 A16``; ``FP16`` for a float layer; ``A16`` for a layer without weights."""
    w, a = row["weight"], row["activation"]
    if a in FLOAT_PRECISIONS and (not w or w == a):
        return a
    if not w:
        return f"A{short(a)}"
    return f"W{short(w)} A{short(a)}"


def overridden(row: dict[str, Any]) -> bool:
    return row["weight_rule"].startswith("override") or row["activation_rule"].startswith(
        "override")


def cell_tip(row: dict[str, Any], heat: float | None = None, heat_text: str = "") -> str:
    w = row["weight"]
    lines = [f"<b>{row['layer']}</b>"]
    if row.get("description"):
        lines.append(f"<i>{row['description']}</i>")
    lines.append(f"weights: <b>{w}</b> — {row['weight_rule']}" if w else
                 "weights: none (no weight tensor)")
    lines.append(f"activations: <b>{row['activation']}</b> — {row['activation_rule']}")
    if row.get("tied_to"):
        lines.append(f"shares its weight with {row['tied_to']}")
    if heat_text:
        lines.append(heat_text if heat is None else f"{heat_text}: {signed(heat, '.3g', '−')}")
    return "<br>".join(lines)


class LayerGridModel(QAbstractTableModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self.layout: GridLayout = GridLayout([], [], [], [], {})
        self._rows: dict[str, dict[str, Any]] = {}
        self._heat: dict[str, float] | None = None
        self._heat_max = 0.0
        self._heat_text = ""

    # ---- filling ------------------------------------------------------------------------------
    def set_rows(self, rows: list[dict[str, Any]]) -> None:
        new = grid_layout(rows)
        by_name = {r["layer"]: r for r in rows}
        same = (new.rows == self.layout.rows and new.columns == self.layout.columns
                and new.cells == self.layout.cells)
        if not same:
            self.beginResetModel()
            self.layout, self._rows = new, by_name
            self.endResetModel()
            return
        changed = [name for name, r in by_name.items() if self._rows.get(name) != r]
        self._rows = by_name
        for name in changed:
            idx = self.index_of(name)
            self.dataChanged.emit(idx, idx)

    def set_heat(self, values: dict[str, float] | None, text: str = "",
                 floor: float = 0.0) -> None:
        """Colour the cells by ``values`` (None: by precision); ``text`` names the figure;
        full colour at the largest value or at ``floor``, whichever is larger."""
        self._heat = dict(values) if values is not None else None
        self._heat_max = max([floor, *(values or {}).values()])
        self._heat_text = text
        if self.rowCount() and self.columnCount():
            self.dataChanged.emit(self.index(0, 0),
                                  self.index(self.rowCount() - 1, self.columnCount() - 1))

    @property
    def heat_on(self) -> bool:
        return self._heat is not None

    @property
    def heat_max(self) -> float:
        return self._heat_max

    def heat_level(self, value: float | None) -> float | None:
        if value is None:
            return None
        if self._heat_max <= 0:
            return 0.0
        return max(0.0, min(1.0, value / self._heat_max))

    # ---- lookups ------------------------------------------------------------------------------
    def row_of(self, layer: str) -> dict[str, Any] | None:
        return self._rows.get(layer)

    def index_of(self, layer: str) -> QModelIndex:
        rc = self.layout.cells.get(layer)
        return self.index(*rc) if rc else QModelIndex()

    def layer_at(self, index: Index) -> str | None:
        return self.layout.layer_at(index.row(), index.column()) if index.isValid() else None

    def layers(self) -> list[str]:
        return list(self._rows)

    # ---- Qt -------------------------------------------------------------------------------------
    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.layout.rows)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.layout.columns)

    def flags(self, index: Index) -> Qt.ItemFlag:
        if self.layer_at(index) is None:
            return Qt.ItemFlag.NoItemFlags
        return Qt.ItemFlag.ItemIsEnabled | Qt.ItemFlag.ItemIsSelectable

    def headerData(self, section: int, orientation: Qt.Orientation,
                   role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        horizontal = orientation == Qt.Orientation.Horizontal
        names = self.layout.titles if horizontal else self.layout.rows
        if not 0 <= section < len(names):
            return None
        if role == Qt.ItemDataRole.DisplayRole:
            text = names[section]
            if horizontal and len(text) > 8 and "_" in text:  # a line per part: narrow columns
                text = "_\n".join(text.split("_"))
            return text
        if role == Qt.ItemDataRole.ToolTipRole:
            if horizontal:
                key = self.layout.columns[section]
                return (f"{key} — click to select the whole column (all blocks)"
                        if key != names[section] or self._in_blocks(section) else key)
            return f"{names[section]} — click to select the whole row"
        return None

    def _in_blocks(self, column: int) -> bool:
        return any(self.layout.layer_at(r, column) is not None
                   for r, b in enumerate(self.layout.row_blocks) if b is not None)

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        name = self.layer_at(index)
        if name is None:
            return None
        row = self._rows[name]
        if role == Qt.ItemDataRole.DisplayRole:
            return cell_text(row)
        if role == LayerRole:
            return row
        heat = self._heat.get(name) if self._heat is not None else None
        if role == HeatRole:
            return heat
        if role == HeatLevelRole:
            return self.heat_level(heat)
        if role == Qt.ItemDataRole.ToolTipRole:
            text = ""
            if self._heat is not None:
                text = self._heat_text if heat is not None else (
                    "sensitivity: not analysed (the analysis varies the layers with weights and "
                    "the key activations)")
            return cell_tip(row, heat, text)
        if role == Qt.ItemDataRole.TextAlignmentRole:
            return int(Qt.AlignmentFlag.AlignCenter)
        return None
