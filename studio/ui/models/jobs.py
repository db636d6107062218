"""The jobs table: one row per job of the run history, updated row by row as events arrive."""

from __future__ import annotations

import bisect
from typing import Any

from PySide6.QtCore import (
    QAbstractTableModel,
    QModelIndex,
    QPersistentModelIndex,
    QSortFilterProxyModel,
    Qt,
)
from PySide6.QtGui import QColor

from studio.core.jobs import Job
from studio.ui.theme import STATE_COLORS
from studio.ui.widgets import fmt_seconds

COLUMNS = ("Run", "Job", "Stage", "Target", "State", "Progress", "Elapsed", "Result")
C_RUN, C_ID, C_STAGE, C_TARGET, C_STATE, C_PROGRESS, C_ELAPSED, C_RESULT = range(len(COLUMNS))
#: which columns show which Job fields (to refresh only what changed)
_FIELDS = {
    C_STATE: ("state",),
    C_PROGRESS: ("progress", "state"),
    C_ELAPSED: ("started", "finished"),
    C_RESULT: ("message", "error", "cached", "state"),
}
JobRole = Qt.ItemDataRole.UserRole + 1
Index = QModelIndex | QPersistentModelIndex


def _key(job: Job) -> tuple[int, int]:
    return (-job.run_id, job.id)  # newest run first, its jobs in DAG order


class JobsModel(QAbstractTableModel):
    def __init__(self, parent=None):
        super().__init__(parent)
        self._jobs: list[Job] = []
        self._keys: list[tuple[int, int]] = []
        self._row: dict[int, int] = {}

    # ---- Qt model API ---------------------------------------------------------------------
    def rowCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(self._jobs)

    def columnCount(self, parent: Index = QModelIndex()) -> int:  # noqa: B008
        return 0 if parent.isValid() else len(COLUMNS)

    def headerData(
        self, section: int, orientation: Qt.Orientation, role: int = Qt.ItemDataRole.DisplayRole
    ) -> Any:
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return COLUMNS[section] if 0 <= section < len(COLUMNS) else None
        return None

    def data(self, index: Index, role: int = Qt.ItemDataRole.DisplayRole) -> Any:
        if not index.isValid() or not 0 <= index.row() < len(self._jobs):
            return None
        job = self._jobs[index.row()]
        col = index.column()
        if role == Qt.ItemDataRole.DisplayRole:
            return self._text(job, col)
        if role == Qt.ItemDataRole.UserRole:
            if col == C_PROGRESS:
                return float(job.progress) if job.started is not None else None
            return None
        if role == JobRole:
            return job
        if role == Qt.ItemDataRole.ForegroundRole and col == C_STATE:
            return QColor(STATE_COLORS.get(job.state, "#777777"))
        if role == Qt.ItemDataRole.ToolTipRole:
            if col in (C_RESULT, C_STATE):
                text = job.error or job.message or job.state
                return f"{job.label}: {text}"
            return None
        if role == Qt.ItemDataRole.TextAlignmentRole and col in (C_RUN, C_ID, C_ELAPSED):
            return int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
        return None

    @staticmethod
    def _text(job: Job, col: int) -> str:
        if col == C_RUN:
            return str(job.run_id)
        if col == C_ID:
            return f"#{job.id}"
        if col == C_STAGE:
            return job.stage
        if col == C_TARGET:
            return job.target or "—"
        if col == C_STATE:
            return job.state
        if col == C_PROGRESS:
            if job.state == "queued":
                return "waiting"
            if job.started is None:
                return "not run"
            return f"{job.progress:.0%}"
        if col == C_ELAPSED:
            return fmt_seconds(job.elapsed)
        if col == C_RESULT:
            text = job.error if job.state == "failed" and job.error else job.message
            if job.cached and job.state == "succeeded":
                text = f"cached · {(job.result or {}).get('summary', text)}"
            elif job.state == "succeeded" and job.result:
                text = job.result.get("summary", text)
            return text or ""
        return ""

    # ---- content --------------------------------------------------------------------------
    def reset(self, jobs: list[Job]) -> None:
        self.beginResetModel()
        self._jobs = sorted(jobs, key=_key)
        self._keys = [_key(j) for j in self._jobs]
        self._row = {j.id: i for i, j in enumerate(self._jobs)}
        self.endResetModel()

    def clear(self) -> None:
        self.reset([])

    def upsert(self, job: Job) -> int:
        """Insert a new job or refresh the changed cells of a known one; returns its row."""
        row = self._row.get(job.id)
        if row is None:
            k = _key(job)
            row = bisect.bisect_left(self._keys, k)
            self.beginInsertRows(QModelIndex(), row, row)
            self._jobs.insert(row, job)
            self._keys.insert(row, k)
            self._row = {j.id: i for i, j in enumerate(self._jobs)}
            self.endInsertRows()
            return row
        old = self._jobs[row]
        self._jobs[row] = job
        cols = [
            c
            for c, fields in _FIELDS.items()
            if any(getattr(old, f) != getattr(job, f) for f in fields)
        ]
        if cols:
            self.dataChanged.emit(self.index(row, min(cols)), self.index(row, max(cols)))
        return row

    def tick(self) -> None:
        """Refresh the elapsed time of running jobs (called once a second)."""
        for row, job in enumerate(self._jobs):
            if job.state == "running":
                idx = self.index(row, C_ELAPSED)
                self.dataChanged.emit(idx, idx)

    def job_at(self, row: int) -> Job | None:
        return self._jobs[row] if 0 <= row < len(self._jobs) else None

    def row_of(self, job_id: int) -> int | None:
        return self._row.get(job_id)

    def jobs(self) -> list[Job]:
        return list(self._jobs)

    def latest_run(self) -> int | None:
        return self._jobs[0].run_id if self._jobs else None


STATE_GROUPS = {
    "All states": None,
    "Active": {"queued", "running"},
    "Succeeded": {"succeeded"},
    "Failed": {"failed"},
    "Cancelled / interrupted": {"cancelled", "interrupted", "skipped"},
}


class JobFilter(QSortFilterProxyModel):
    """Filters: a state group, a stage, the latest run only, free text (stage/target/result)."""

    def __init__(self, parent=None):
        super().__init__(parent)
        self.states: set[str] | None = None
        self.stage: str | None = None
        self.latest_only = False
        self.text = ""

    def set_filter(self, *, states=..., stage=..., latest_only=..., text=...) -> None:
        self.beginFilterChange()
        if states is not ...:
            self.states = states
        if stage is not ...:
            self.stage = stage
        if latest_only is not ...:
            self.latest_only = bool(latest_only)
        if text is not ...:
            self.text = str(text).strip().lower()
        self.endFilterChange(QSortFilterProxyModel.Direction.Rows)

    def filterAcceptsRow(self, source_row: int, source_parent: Index) -> bool:
        model = self.sourceModel()
        if not isinstance(model, JobsModel):
            return True
        job = model.job_at(source_row)
        if job is None:
            return False
        if self.states is not None and job.state not in self.states:
            return False
        if self.stage and job.stage != self.stage:
            return False
        if self.latest_only and job.run_id != model.latest_run():
            return False
        if self.text:
            hay = f"{job.stage} {job.target} {job.state} {job.message} {job.error or ''}".lower()
            if self.text not in hay:
                return False
        return True
