"""Queue: every run and sweep of every project, lined up.

What runs, what waits and why (the project's earlier item, a free slot, memory, a paused
queue, another process), what ended and how. Reorder, raise the priority, cancel one, pause
the queue, open an item's project. The queue is kept in the app's config folder: what waits
survives a restart of the window (it comes back paused, so nothing starts unasked).
"""

from __future__ import annotations

import time

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QSpinBox,
    QTableView,
    QVBoxLayout,
)

from studio.core.errors import StudioError
from studio.services import workqueue
from studio.services.workqueue import QueueItem
from studio.ui.models.rows import Row, RowsModel
from studio.ui.pages.base import Page
from studio.ui.standalone import run_page
from studio.ui.widgets import EmptyState, fmt_seconds, label

COLUMNS = ["#", "Project", "What", "Priority", "State", "Now / why it waits / how it ended",
           "Added", "Took"]
STATE_COLOURS = {"running": "#1f77b4", "succeeded": "#2ca02c", "failed": "#d62728",
                 "cancelled": "#8c8c8c", "waiting": "#b8860b"}


class QueuePage(Page):
    key = "queue"
    needs_project = False  # the queue is the window's, not a project's

    def __init__(self, ctl, parent=None):
        super().__init__(ctl, parent)
        self.queue = ctl.queue
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(0, 6, 0, 0)
        bar = QHBoxLayout()
        self.pause_button = QPushButton("Pause queue")
        self.pause_button.clicked.connect(self.toggle_pause)
        bar.addWidget(self.pause_button)
        bar.addSpacing(8)
        bar.addWidget(label("At once:"))
        self.slots = QSpinBox()
        self.slots.setRange(1, 64)
        self.slots.setValue(self.queue.queue.slots)
        self.slots.setToolTip(
            "How many items run together (a sweep takes as many as its workers). Default: one "
            "per four cores: the HTP simulator and the quantizer each keep a core busy, and the "
            "profile's simulated timings follow the host's load")
        self.slots.valueChanged.connect(self._set_slots)
        bar.addWidget(self.slots)
        bar.addSpacing(12)
        self.up_button = QPushButton("▲ Earlier")
        self.up_button.clicked.connect(lambda: self._move(-1))
        self.down_button = QPushButton("▼ Later")
        self.down_button.clicked.connect(lambda: self._move(1))
        self.priority_button = QPushButton("Priority: high")
        self.priority_button.clicked.connect(self._toggle_priority)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self._cancel)
        self.open_button = QPushButton("Open its project")
        self.open_button.clicked.connect(self._open_project)
        self.clear_button = QPushButton("Clear ended")
        self.clear_button.setToolTip("Remove the items that ended from the list (their runs "
                                     "stay in each project's history)")
        self.clear_button.clicked.connect(self.queue.clear_finished)
        for b in (self.up_button, self.down_button, self.priority_button, self.cancel_button,
                  self.open_button):
            bar.addWidget(b)
        bar.addStretch(1)
        bar.addWidget(self.clear_button)
        lay.addLayout(bar)
        self.status = label("", wrap=True)
        lay.addWidget(self.status)
        self.empty = EmptyState(
            "The queue is empty",
            "Every Run — the pipeline, one stage, a retry, a sweep, the waterfall, a profile "
            "measured again — of any project comes here and runs when its turn comes: queue "
            "work on several projects and walk away.")
        lay.addWidget(self.empty)
        self.model = RowsModel(COLUMNS, self)
        self.table = QTableView()
        self.table.setModel(self.model)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.verticalHeader().hide()
        self.table.setWordWrap(False)
        h = self.table.horizontalHeader()
        for c in range(len(COLUMNS)):
            h.setSectionResizeMode(c, QHeaderView.ResizeMode.ResizeToContents)
        h.setSectionResizeMode(5, QHeaderView.ResizeMode.Stretch)
        self.table.selectionModel().selectionChanged.connect(lambda *_: self._update_buttons())
        lay.addWidget(self.table, 1)
        self._tick = QTimer(self)
        self._tick.setInterval(1000)  # the running items' time and progress
        self._tick.timeout.connect(self.refresh)
        self._coalesce = QTimer(self)  # bursts of queue events: one redraw
        self._coalesce.setSingleShot(True)
        self._coalesce.setInterval(100)
        self._coalesce.timeout.connect(self.refresh)
        self.queue.changed.connect(self._queue_changed)
        self.refresh()

    def on_open(self) -> None:
        self.refresh()

    def on_close(self) -> None:
        self.refresh()

    def on_show(self) -> None:
        self.refresh()

    # ---- the list ----------------------------------------------------------------------------
    def _queue_changed(self) -> None:
        if not self._coalesce.isActive():
            self._coalesce.start()

    def selected(self) -> QueueItem | None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return None
        row = self.model.row(rows[0].row())
        return row.payload if row is not None else None

    def select_item(self, item_id: int) -> bool:
        for r in range(self.model.rowCount()):
            row = self.model.row(r)
            if row is not None and row.payload.id == item_id:
                self.table.selectRow(r)
                return True
        return False

    def refresh(self) -> None:
        if self.queue.closed:
            return
        chosen = self.selected()
        items = self.queue.items()
        now = time.time()
        rows = [self._row(i, now) for i in items]
        self.model.set_rows(rows)
        self.empty.setVisible(not items)
        self.table.setVisible(bool(items))
        if chosen is not None:
            self.select_item(chosen.id)
        running = [i for i in items if i.state == workqueue.RUNNING]
        paused = self.queue.paused
        # the count the status bar shows too (QueueRunner.counts)
        text = workqueue.Counts.of(items, False).text()
        if paused:
            text += (" · the queue is paused: nothing new starts"
                     + (f" ({self.queue.left_over} item(s) left from the last session)"
                        if self.queue.left_over else ""))
        self.status.setText(text)
        self.slots.blockSignals(True)
        self.slots.setValue(self.queue.queue.slots)
        self.slots.blockSignals(False)
        self.pause_button.setText("Resume queue" if paused else "Pause queue")
        self.pause_button.setToolTip(
            "Start waiting items again" if paused else
            "Start nothing new (what runs goes on); the queue stays paused across restarts")
        if running and not self._tick.isActive():
            self._tick.start()
        elif not running:
            self._tick.stop()
        self._update_buttons()

    def _row(self, i: QueueItem, now: float) -> Row:
        if i.state == workqueue.RUNNING:
            note = i.progress or "running"
            took = fmt_seconds(now - (i.started or now))
        elif i.state == workqueue.WAITING:
            note = self.queue.why.get(i.id, "starts now")
            if i.message:
                note = f"{note} · {i.message}"
            took = ""
        else:
            note = i.message or ("run " + str(i.run_id) if i.run_id else "")
            if i.run_id and i.message:
                note = f"run {i.run_id}: {i.message}"
            took = fmt_seconds((i.finished or now) - (i.started or i.finished or now)) \
                if i.started else ""
        peak = (f"\npredicted peak {i.peak / 2**30:.1f} GiB (estimated)"
                if i.peak is not None else "")
        return Row(
            [str(i.id), i.name, i.what, workqueue.PRIORITIES[i.priority], i.state, note,
             time.strftime("%H:%M:%S", time.localtime(i.added)), took],
            tip=f"{i.label}\n{i.project}{peak}\n{note}",
            colors={4: STATE_COLOURS.get(i.state, "")},
            payload=i,
        )

    def _update_buttons(self) -> None:
        i = self.selected()
        waiting = i is not None and i.state == workqueue.WAITING
        live = i is not None and i.state in (workqueue.WAITING, workqueue.RUNNING)
        for b in (self.up_button, self.down_button, self.priority_button):
            b.setEnabled(waiting)
            b.setToolTip("" if waiting else "Select a waiting item")
        self.priority_button.setText("Priority: normal" if waiting and i.priority
                                     else "Priority: high")
        self.cancel_button.setEnabled(live)
        self.cancel_button.setToolTip(
            "Select a waiting or running item" if not live else
            f"Stop #{i.id} (its worker is terminated; finished stages stay in the store)"
            if i.state == workqueue.RUNNING else f"#{i.id} will not start")
        self.open_button.setEnabled(i is not None)
        self.clear_button.setEnabled(any(r.payload.state in workqueue.FINAL
                                         for r in (self.model.row(k) for k in
                                                   range(self.model.rowCount())) if r))

    # ---- actions --------------------------------------------------------------------------------
    def toggle_pause(self) -> None:
        self.queue.set_paused(not self.queue.paused)
        self.refresh()

    def _set_slots(self, n: int) -> None:
        self.queue.set_slots(n)

    def _move(self, delta: int) -> None:
        i = self.selected()
        if i is None:
            return
        try:
            self.queue.move(i.id, delta)
        except StudioError as exc:
            self.ctl.message.emit("error", exc.message)
        self.refresh()

    def _toggle_priority(self) -> None:
        i = self.selected()
        if i is not None:
            self.queue.set_priority(i.id, 0 if i.priority else 1)
            self.refresh()

    def _cancel(self) -> None:
        i = self.selected()
        if i is not None:
            self.queue.cancel(i.id)
            self.refresh()

    def _open_project(self) -> None:
        i = self.selected()
        if i is not None:
            self.navigate.emit("action:open-path:" + i.project)


def main() -> int:
    return run_page(QueuePage)


if __name__ == "__main__":
    raise SystemExit(main())
