"""A small read-only table model for lists of rows (metrics, chips, layers, overrides...)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QAbstractTableModel, QModelIndex, QPersistentModelIndex, Qt
from PySide6.QtGui import QColor

Index = QModelIndex | QPersistentModelIndex
PayloadRole = Qt.ItemDataRole.UserRole + 1


@dataclass
class Row:
    cells: list[str]
    tip: str = ""
    colors: dict[int, str] = field(default_factory=dict)  # column -> text colour
    payload: Any = None
    align_right: tuple[int, ...] = ()


class RowsModel(QAbstractTableModel):
    def __init__(self, columns: list[str], parent=None):
        super().__init__(parent)
        self.columns = list(columns)
        self._rows: list[Row] = []

    def set_rows(self, rows: list[Row]) -> None:
        """Replace the rows; when only cells changed, refresh just those rows."""
        if len(rows) == len(self._rows) and rows:
            changed = [
                i
                for i, (a, b) in enumerate(zip(self._rows, rows, strict=True))
                if a.cells != b.cells or a.colors != b.colors or a.tip != b.tip
            ]
            self._rows = list(rows)
            for i in changed:
                self.dataChanged.emit(self.index(i, 0), self.index(i, len(self.columns) - 1))
            return
        self.beginResetModel()
        self._rows = list(rows)
        self.endResetModel()

    def row(self, i: int) -> Row | None:
        return self._rows[i] if 0 <= i < len(self._rows) else None

    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._rows)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self.columns)

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return self.columns[section] if 0 <= section < len(self.columns) else None
        return None

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._rows):
            return None
        r = self._rows[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return r.cells[col] if col < len(r.cells) else ""
        if role == Qt.ItemDataRole.ToolTipRole:
            return r.tip or None
        if role == Qt.ItemDataRole.ForegroundRole and col in r.colors:
            return QColor(r.colors[col])
        if role == Qt.ItemDataRole.TextAlignmentRole and col in r.align_right:
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        if role == PayloadRole:
            return r.payload
        return None
