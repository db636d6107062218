"""Sweeps: a project's recipe sweeps — run one (every point through the pipeline on the local
process pool), watch its points live, compare them (accuracy against weight bytes, the Pareto
front, the best point by the sweep's rule, every figure with its source), open a point's run
and apply a point's settings to the project as one undoable step.

The sweep runs like the controller runs the pipeline: ``SweepRunner.run`` on its own asyncio
loop in a worker thread (it hashes inputs and verifies artifacts between its awaits), its
events copied in that thread and carried to the widgets by a queued Qt signal; ``cancel``
is called on the runner's loop. The UI thread never waits for it.
"""

from __future__ import annotations

import html
import os
import time
import traceback
from typing import Any

from PySide6.QtCore import QEvent, Qt, QTimer
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QApplication,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QSpinBox,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from studio.core.errors import StudioError
from studio.core.project import apply_point
from studio.core.sweep import BEST_RULES, Point, best_point, format_value, pareto_front
from studio.services.sweep_report import point_rows, write_sweep_report
from studio.services.sweeps import (
    ACCURACY,
    LADDER,
    apply_point_edits,
    apply_point_label,
    find_spec,
    point_result,
    recorded,
    sweep_names,
    sweep_stages,
)
from studio.services.workers import local_workers
from studio.ui.item_thread import ItemThread
from studio.ui.pages.base import Page
from studio.ui.pages.sweep_plot import SweepPlot
from studio.ui.pages.sweep_rows import (
    COL,
    COLUMNS,
    EXAMPLE,
    SOURCES_TEXT,
    best_html,
    cell_texts,
    cell_tips,
    column_heads,
    point_run,
    size_title,
    sources_of,
)
from studio.ui.standalone import run_page
from studio.ui.sweep_dialog import NewSweepDialog
from studio.ui.widgets import (
    EmptyState,
    SourceBadge,
    label,
    read_only_table,
    splitter,
    theme_plot,
)

STATE_COLORS = {"succeeded": "#1b7f3b", "failed": "#c62828", "invalid": "#c62828",
                "cancelled": "#5b6570", "running": "#2f5da8"}


class SweepsPage(Page):
    key = "sweeps"

    def __init__(self, ctl, parent=None):
        super().__init__(ctl, parent)
        self.rec: dict[str, Any] | None = None  # what the table and the plot show
        self.rows: list[dict[str, Any]] = []
        self.sweep: ItemThread | None = None
        self._sweep_name = ""
        self._live: dict[int, dict[str, Any]] = {}  # point index -> its latest dict
        self._jobs: dict[str, dict[str, Any]] = {}  # artifact key -> the job's latest dict
        self._jobs_total = 0
        self._started = 0.0
        self._spec = None
        self._selected: str | None = None  # the selected point's label
        self._selecting = False
        self._redraw = QTimer(self)
        self._redraw.setSingleShot(True)
        self._redraw.setInterval(200)
        self._points_changed = False
        self._redraw.timeout.connect(self._show_live)

        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(0, 6, 0, 0)
        self.empty = EmptyState("No sweeps in this project", "")
        self.empty.add_action("New sweep…", self.new_sweep,
                              "Pick the settings to vary and their values")
        self.empty.add_action("Copy the example", self._copy_example,
                              "Copy the [[sweeps]] table above, to paste into the project file")
        lay.addWidget(self.empty)
        self.content = QWidget()
        cl = QVBoxLayout(self.content)
        cl.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.content, 1)
        cl.addLayout(self._build_bar())
        self._build_lines(cl)
        self.chart = SweepPlot()
        self.chart.clicked.connect(self._plot_clicked)
        split = splitter(Qt.Orientation.Vertical, self.chart, self._build_table(),
                         sizes=(9_000, 9_000))
        cl.addWidget(split, 1)
        cl.addLayout(self._build_sources())

        self.apply_theme()
        self.content.hide()
        ctl.running_changed.connect(self._pipeline_running)
        ctl.closing.connect(self._closing)
        ctl.queue.started.connect(self._sweep_started)
        ctl.queue.changed.connect(self._queue_changed)
        self._update_buttons()

    # ---- building the page ------------------------------------------------------------------
    def _build_bar(self) -> QHBoxLayout:
        """The sweep shown, the workers, run and cancel, the status."""
        bar = QHBoxLayout()
        bar.addWidget(label("Sweep:"))
        self.combo = QComboBox()
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.combo.currentIndexChanged.connect(lambda *_: self.refresh())
        bar.addWidget(self.combo)
        bar.addSpacing(12)
        bar.addWidget(label("Workers:"))
        self.workers = QSpinBox()
        self.workers.setToolTip("Stage jobs run at once on this machine's process pool")
        bar.addWidget(self.workers)
        self.run_button = QPushButton("Run sweep")
        self.run_button.setToolTip("Run every point through the pipeline (points that share "
                                   "a stage share its job; finished jobs come from the store)")
        self.run_button.clicked.connect(self.run_sweep)
        bar.addWidget(self.run_button)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop the sweep: running jobs are stopped, finished "
                                      "points stay recorded")
        self.cancel_button.clicked.connect(self.cancel_sweep)
        bar.addWidget(self.cancel_button)
        self.new_button = QPushButton("New sweep…")
        self.new_button.setToolTip("A new sweep: pick the recipe's settings to vary and their "
                                   "values")
        self.new_button.clicked.connect(self.new_sweep)
        bar.addWidget(self.new_button)
        self.status = label("", "muted")
        bar.addWidget(self.status, 1)
        return bar

    def _build_lines(self, cl: QVBoxLayout) -> None:
        """The sweep's spec, a note, and the best point."""
        self.spec_line = label("", "muted", wrap=True)
        cl.addWidget(self.spec_line)
        self.note = label("", "muted", wrap=True)
        self.note.hide()
        cl.addWidget(self.note)
        self.best_line = label("", wrap=True, selectable=True)
        self.best_line.setTextFormat(Qt.TextFormat.RichText)
        cl.addWidget(self.best_line)

    def _build_table(self) -> QWidget:
        """Every point, and what to do with the selected one."""
        tbox = QWidget()
        tl = QVBoxLayout(tbox)
        tl.setContentsMargins(0, 4, 0, 0)
        self.table = read_only_table(COLUMNS)
        hh = self.table.horizontalHeader()
        hh.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)  # sized in _fill_table
        hh.setStretchLastSection(True)  # the reason takes the rest, wrapped
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setWordWrap(True)  # a long reason wraps in its row
        self.table.itemSelectionChanged.connect(self._row_selected)
        self.table.itemDoubleClicked.connect(lambda *_: self.open_run())
        tl.addWidget(self.table, 1)
        actions = QHBoxLayout()
        self.selection = label("", "muted", wrap=True)
        actions.addWidget(self.selection, 1)
        self.open_button = QPushButton("Open run")
        self.open_button.setToolTip("Show the selected point's run (its validation against "
                                    "FP32) on the Validation page")
        self.open_button.clicked.connect(self.open_run)
        actions.addWidget(self.open_button)
        self.apply_button = QPushButton("Apply to project")
        self.apply_button.clicked.connect(self.apply_selected)
        actions.addWidget(self.apply_button)
        self.report_button = QPushButton("Write report")
        self.report_button.setToolTip("Write the sweep's HTML and JSON report into the "
                                      "project's reports/ folder")
        self.report_button.clicked.connect(self.write_report)
        actions.addWidget(self.report_button)
        tl.addLayout(actions)
        return tbox

    def _build_sources(self) -> QHBoxLayout:
        """Where the figures come from."""
        sources = QHBoxLayout()
        sources.addWidget(SourceBadge("simulated", "accuracy: the HTP simulator"))
        sources.addWidget(SourceBadge("measured", "size: the compiled context binaries' "
                                                  "file sizes"))
        sources.addWidget(SourceBadge("estimated", "weights from the recipe; tok/s from the "
                                                   "performance model"))
        self.sources = label(SOURCES_TEXT, "muted", wrap=True)
        sources.addWidget(self.sources, 1)

        return sources

    # ---- theme ------------------------------------------------------------------------------
    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and hasattr(self, "chart"):
            self.apply_theme()

    def apply_theme(self) -> None:
        theme_plot(self.plot, self.palette())
        if self.rec is not None:  # the labels and the selection ring take the new colours
            self._draw_plot()
            self._select(self._selected)

    # ---- state ------------------------------------------------------------------------------
    @property
    def running(self) -> bool:
        return self.sweep is not None

    def current_name(self) -> str | None:
        return self.combo.currentData()

    def _declared(self, name: str | None) -> bool:
        p = self.ctl.project
        return p is not None and any(t["name"] == name for t in p.sweeps)

    def on_open(self) -> None:
        n, why = local_workers(None)
        self.workers.setRange(1, max(n, os.cpu_count() or 1))
        self.workers.setValue(n)
        self.workers.setToolTip(f"Stage jobs run at once on this machine's process pool "
                                f"(default {why})")
        self._selected = None
        self.fill_combo()

    def on_show(self) -> None:
        if not self.running:
            self.fill_combo()

    def on_close(self) -> None:
        self.rec, self.rows = None, []
        self.table.setRowCount(0)

    def on_change(self, change) -> None:
        if ("", "sweeps") in set(change) and not self.running:
            self.fill_combo()  # a sweep added or removed (the dialog, Undo, a reload)
        self._show_selection()  # "the project's settings now" follows the edits

    def _queued(self):
        """The picked sweep's item waiting in the work queue, or None."""
        name = self.current_name()
        return next((i for i in self.ctl.queue.waiting_for(
            self.ctl.project.path if self.ctl.studio else None)
            if i.kind == "sweep" and i.spec.get("sweep") == name), None)

    def _queue_changed(self) -> None:
        if self.ctl.studio is not None and not self.running:
            self._update_buttons()

    def _pipeline_running(self, running: bool) -> None:
        if running or self.running:
            self._update_buttons()
        else:
            self.refresh()  # the status line loses its "the pipeline is running"

    def _closing(self) -> None:
        """The session closes: a running sweep goes on in the work queue (on a session of
        its own); the page lets go of it."""
        if self.sweep is not None:
            self.sweep.event.disconnect(self._on_event)
            self.sweep = None
            self._redraw.stop()

    # ---- the sweeps -------------------------------------------------------------------------
    def fill_combo(self) -> None:
        """The project's sweeps: declared ones first, then recorded ones."""
        studio = self.ctl.studio
        if studio is None:
            return
        names = sweep_names(studio.project, studio.jobs)
        current = self.current_name()
        self.combo.blockSignals(True)
        self.combo.clear()
        for n in names:
            self.combo.addItem(n, n)
            self.combo.setItemData(
                self.combo.count() - 1,
                "declared in the project file" if self._declared(n)
                else "a precision ladder (studio sweep FILE --ladder N)" if n == LADDER
                else "recorded; the project file no longer declares it",
                Qt.ItemDataRole.ToolTipRole)
        self.combo.setCurrentIndex(max(0, self.combo.findData(current)))
        self.combo.blockSignals(False)
        if not names:
            self._show_empty()
            return
        self.empty.hide()
        self.content.show()
        self.refresh()

    def _show_empty(self) -> None:
        path = self.ctl.project.path
        self.empty.set_text(
            "No sweeps in this project",
            "A sweep runs variants of the recipe through the pipeline and compares them: "
            "accuracy against size, the Pareto front, the best point to apply. Declare one "
            f"in <b>{html.escape(path.name)}</b> — a <code>[[sweeps]]</code> table whose axes "
            "name project settings:"
            f'<pre style="text-align:left">{html.escape(EXAMPLE)}</pre>'
            "QStudio notices the change and offers to reload the file. Or run one from a "
            "terminal; it shows here once recorded:"
            f"<pre>studio sweep {html.escape(path.name)} --axis "
            "quantization.scheme=W8A16,W8A8</pre>")
        self.content.hide()
        self.empty.show()
        self.rec, self.rows = None, []
        self._update_buttons()

    def new_sweep(self, table: dict[str, Any] | None = None) -> bool:
        """Add a sweep to the project (one undoable edit) from the New sweep dialog, or the
        ``table`` given (tests); then show it. False when nothing was added."""
        if self.ctl.studio is None:
            return False
        if table is None:
            dialog = NewSweepDialog(self.ctl.project, self)
            if dialog.exec() != NewSweepDialog.DialogCode.Accepted:
                return False
            table = dialog.table()
        try:
            self.ctl.set("", "sweeps", [*self.ctl.project.sweeps, table],
                         label=f"Add sweep {table['name']!r}")
        except StudioError as exc:
            self.ctl.message.emit("error", exc.message)
            return False
        self.fill_combo()
        self.combo.setCurrentIndex(max(0, self.combo.findData(table["name"])))
        return True

    def _copy_example(self) -> None:
        QApplication.clipboard().setText(EXAMPLE + "\n")
        self.ctl.message.emit("info", "Copied a [[sweeps]] table: paste it at the end of the "
                                      "project file")

    def refresh(self) -> None:
        """Show the picked sweep as the history records it (or its points, not run yet)."""
        studio = self.ctl.studio
        name = self.current_name()
        if studio is None or name is None or self.running:
            return
        self._spec = None
        self.note.hide()
        if self._declared(name):
            try:
                self._spec = find_spec(studio.project, name)
            except StudioError as exc:
                self._set_note(exc.message)
        elif name == LADDER:
            self._set_note("A precision ladder (rung k raises the k layers the sensitivity "
                           "result ranks first), run with studio sweep "
                           f"{studio.project.path.name} --ladder N: its record is shown.")
        else:
            self._set_note(f"The project file no longer declares {name!r}: its record is "
                           "shown; declare it again to run it.")
        try:
            rec = recorded(studio.project, studio.jobs, name)
        except StudioError as exc:
            rec = None
            self._set_note(exc.message)
        if rec is None and self._spec is not None:
            rec = self._not_run(self._spec)
        self._describe_spec()
        if rec is not None:
            if rec["state"] == "not run":
                self.status.setText("Not run yet")
            else:
                when = time.strftime("%Y-%m-%d %H:%M", time.localtime(rec["updated"]))
                self.status.setText(f"{rec['state']} · {when} · {rec['executor']} executor")
            self.show_rec(rec)
        self._update_buttons()

    def _set_note(self, text: str) -> None:
        self.note.setText(text)
        self.note.setVisible(bool(text))

    def _not_run(self, spec) -> dict[str, Any]:
        kind = self.ctl.project.model["kind"]
        return {"name": spec.name, "state": "not run", "executor": "", "updated": 0,
                "points": [{"label": p.label, "index": p.index, "settings": dict(p.settings),
                            "state": "not run", "reason": "", "run_id": None}
                           for p in spec.expand()],
                "pareto_front": [], "best": None, "best_rule": spec.best,
                "accuracy_title": ACCURACY[kind][1]}

    def _describe_spec(self) -> None:
        spec = self._spec
        if spec is None:
            self.spec_line.setText("")
            return
        n = len(spec.expand())
        if spec.points:
            what = f"{n} listed point(s)"
        else:
            what = (f"{n} point(s): a grid of " + " × ".join(
                f"{k} ({', '.join(format_value(v) for v in vals)})" for k, vals in spec.axes))
        stages = " → ".join(sweep_stages(spec, self.ctl.project.model["kind"]))
        desc = f" — {spec.description}" if spec.description else ""
        self.spec_line.setText(f"{what} · stages {stages} · best: {spec.best} "
                               f"({BEST_RULES[spec.best]}){desc}")

    # ---- running ----------------------------------------------------------------------------
    def run_sweep(self) -> bool:
        """Queue the picked sweep (it runs on the local process pool when the work queue
        starts it: now, or after what runs); False (and why) when it cannot."""
        studio = self.ctl.studio
        name = self.current_name()
        if studio is None or name is None or self.running:
            return False
        try:
            find_spec(studio.project, name)
            item, _, joined = self.ctl.queue.add(
                studio.project, "sweep", {"sweep": name, "workers": self.workers.value()})
        except StudioError as exc:
            self.ctl.message.emit("error", exc.message)
            return False
        if joined:
            self.status.setText(f"Sweep {name!r} is already #{item.id} ({item.state}): not "
                                "queued twice")
            self.ctl.message.emit("info", f"Sweep {name!r} is already queued as #{item.id} "
                                          f"({item.state}): not queued twice")
        elif item.state == "waiting":
            why = self.ctl.queue.why.get(item.id, "it waits its turn")
            self.status.setText(f"Queued as #{item.id}: {why}")
            self.ctl.message.emit("info", f"Sweep {name!r} queued as #{item.id}: {why}")
        self._update_buttons()
        return True

    def _sweep_started(self, item, thread) -> None:
        """The work queue started an item: show it live when it is a sweep of the open
        project."""
        studio = self.ctl.studio
        if (item.kind != "sweep" or studio is None
                or studio.project.path.resolve() != item.path):
            return
        try:
            self._spec = find_spec(studio.project, item.spec["sweep"])
        except StudioError:  # not in the file: the item ends saying so, in the queue
            return
        self._sweep_name = item.spec["sweep"]
        i = self.combo.findData(self._sweep_name)
        if i >= 0:
            self.combo.setCurrentIndex(i)
        self._live = {}
        self._jobs = {}
        self._jobs_total = 0
        self._started = time.monotonic()
        self.sweep = thread
        thread.event.connect(self._on_event)
        self.status.setText("Planning the points (hashing the inputs)…")
        self._update_buttons()

    def cancel_sweep(self) -> None:
        if self.sweep is not None:
            self.sweep.cancel()
            self.status.setText("Cancelling: stopping the running jobs…")
            self.cancel_button.setEnabled(False)

    def _on_event(self, ev: dict[str, Any]) -> None:
        kind = ev["kind"]
        if kind == "point":
            p = ev["point"]
            self._live[p["index"]] = p
            self._points_changed = True
            self._redraw.start()
        elif kind == "job":
            j = ev["job"]
            self._jobs[j["key"]] = j
            self._redraw.start()
        elif kind == "sweep":
            if ev.get("state") == "running":
                self._jobs_total = int(ev.get("jobs") or 0)
            self._redraw.start()
        elif kind == "done":
            self._finished(ev)

    def _live_rec(self) -> dict[str, Any]:
        pts = [self._live[i] for i in sorted(self._live)]
        results = [point_result(point_run(p)) for p in pts]
        rule = self._spec.best if self._spec is not None else "smallest"
        return {"name": self._sweep_name, "state": "running", "executor": "local",
                "updated": time.time(), "points": pts, "pareto_front": pareto_front(results),
                "best": best_point(results, rule), "best_rule": rule,
                "accuracy_title": ACCURACY[self.ctl.project.model["kind"]][1]}

    def _show_live(self) -> None:
        if self.sweep is None or self.ctl.studio is None:
            return
        jobs = list(self._jobs.values())
        done = [j for j in jobs if j["state"] in ("succeeded", "failed", "cancelled")]
        cached = sum(1 for j in done if j["cached"])
        running = [j for j in jobs if j["state"] == "running"]
        took = time.monotonic() - self._started
        text = f"Running · {took:.0f} s"
        if self._jobs_total:
            text += f" · {len(done)} of {self._jobs_total} jobs done"
            if cached:
                text += f" ({cached} from the store)"
        if running:
            labels = {p["id"]: p["label"] for p in self._live.values()}
            text += " · now " + ", ".join(
                f"{j['label']} for {', '.join(labels.get(i, '?') for i in j['points'])} "
                f"{j['progress']:.0%}" for j in running)
        if self.sweep.cancel_asked:
            text = "Cancelling · " + text
        self.status.setText(text)
        if self._points_changed and self._live:
            self._points_changed = False
            self.show_rec(self._live_rec())
        elif self.rec is not None:
            self._fill_table()  # the running jobs' progress in the state column
            self._select(self._selected)

    def _finished(self, ev: dict[str, Any]) -> None:
        self._redraw.stop()
        self.sweep = None
        err = ev.get("error")
        if isinstance(err, StudioError):
            self.ctl.message.emit("error", f"The sweep {self._sweep_name!r} stopped: "
                                           f"{err.message}")
        elif err is not None:
            self.ctl.message.emit("error", f"The sweep {self._sweep_name!r} stopped with an "
                                           f"unexpected error: {err!r}")
            traceback.print_exception(err)
        if self.ctl.studio is None:
            return
        self.refresh()
        s = ev.get("summary")
        if s is not None:
            best = f"; best {s['best']}" if s.get("best") else ""
            self.ctl.message.emit("info", f"Sweep {s['sweep']}: {s['state']} in "
                                          f"{s['seconds']:.0f} s{best}")

    # ---- drawing ----------------------------------------------------------------------------
    def show_rec(self, rec: dict[str, Any]) -> None:
        """Draw a sweep (recorded, or live while it runs): the table, the plot, the best."""
        self.rec = rec
        self.rows = point_rows(rec)
        for r, p in zip(self.rows, rec["points"], strict=True):
            r["point"] = p
        if self._selected is None or not any(r["label"] == self._selected for r in self.rows):
            best = next((r for r in self.rows if r["best"]), None)
            self._selected = best["label"] if best else None
        self._fill_table()
        self._draw_plot()
        self._show_best()
        self._select(self._selected)

    def _acc_source(self) -> str:
        return sources_of(self.rows, "accuracy_source", "simulated")

    def _weight_source(self) -> str:
        default = "estimated" if self.ctl.project is None or \
            self.ctl.project.model["kind"] == "causal-lm" else "measured"
        return sources_of(self.rows, "weight_source", default)

    def _fill_table(self) -> None:
        rec = self.rec
        assert rec is not None
        chips = sorted({r["tokens_chip"] for r in self.rows if r["tokens_chip"]})
        chip = ", ".join(chips) or (self.ctl.project.targets[0] if self.ctl.project else "")
        heads = column_heads(rec, self._acc_source(), self._weight_source(), chip)
        for c, name in enumerate(COLUMNS):
            text, tip = heads.get(name, (name, ""))
            item = QTableWidgetItem(text)
            item.setToolTip(tip)
            self.table.setHorizontalHeaderItem(c, item)
        running_jobs: dict[str, list[dict[str, Any]]] = {}
        if self.running:
            for j in self._jobs.values():
                if j["state"] == "running":
                    for pid in j["points"]:
                        running_jobs.setdefault(pid, []).append(j)
        bold = QFont()
        bold.setBold(True)
        self.table.setRowCount(len(self.rows))
        for i, r in enumerate(self.rows):
            cells = cell_texts(r, running_jobs.get(r["point"].get("id", ""), []))
            tips = cell_tips(r)
            for j, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(tips.get(COLUMNS[j], text))
                if j == COL["state"] and r["state"] in STATE_COLORS:
                    item.setForeground(QBrush(QColor(STATE_COLORS[r["state"]])))
                if r["best"]:
                    item.setFont(bold)
                if j in (COL["accuracy"], COL["perplexity change"], COL["size"], COL["weights"],
                         COL["decode tok/s"], COL["run"]):
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight
                                          | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(i, j, item)
        for c in range(len(COLUMNS) - 1):
            self.table.resizeColumnToContents(c)
        if self.table.columnWidth(COL["settings"]) > 320:  # many axes: wrap the settings
            self.table.setColumnWidth(COL["settings"], 320)
        self.table.resizeRowsToContents()

    def _draw_plot(self) -> None:
        rec = self.rec
        assert rec is not None
        self.chart.draw(self.rows, f"{rec['accuracy_title']}<br>({self._acc_source()}) →",
                        size_title(self.rows) + " →", self.running)

    # the chart's parts, as the page's (what tests and the theme reach)
    @property
    def plot(self):
        return self.chart.plot

    @property
    def scatter(self):
        return self.chart.scatter

    @property
    def selection_ring(self):
        return self.chart.selection_ring

    def _show_best(self) -> None:
        assert self.rec is not None
        self.best_line.setText(best_html(self.rec, self.rows, self.running))

    # ---- selection --------------------------------------------------------------------------
    def selected_point(self) -> dict[str, Any] | None:
        r = next((r for r in self.rows if r["label"] == self._selected), None)
        return r["point"] if r is not None else None

    def select_point(self, label_: str | None) -> None:
        """Select a point (by label, e.g. "p2") in the table and the plot."""
        self._selected = label_
        self._select(label_)

    def _select(self, label_: str | None) -> None:
        row = next((i for i, r in enumerate(self.rows) if r["label"] == label_), None)
        self._selecting = True
        try:
            if row is None:
                self.table.clearSelection()
            else:
                self.table.selectRow(row)
        finally:
            self._selecting = False
        self.chart.ring(row)
        self._show_selection()

    def _row_selected(self) -> None:
        if self._selecting:
            return
        rows = self.table.selectionModel().selectedRows()
        if rows and rows[0].row() < len(self.rows):
            self.select_point(self.rows[rows[0].row()]["label"])
        else:
            self._selected = None
            self._show_selection()

    def _plot_clicked(self, i: int) -> None:
        if i < len(self.rows):
            self.select_point(self.rows[i]["label"])

    def _is_current(self, p: dict[str, Any]) -> bool:
        """Whether the project's settings now are the point's."""
        project = self.ctl.project
        if project is None:
            return False
        try:
            return apply_point(project, p["settings"]).to_dict() == project.to_dict()
        except StudioError:
            return False

    def _show_selection(self) -> None:
        p = self.selected_point()
        if p is None:
            self.selection.setText("Select a point (a row or a dot in the plot) to open its "
                                   "run or apply its settings.")
        else:
            desc = Point(p["index"], p["settings"]).describe()
            now = " — the project's settings now" if self._is_current(p) else ""
            run = f" · run {p['run_id']}" if p.get("run_id") else ""
            self.selection.setText(f"Selected {p['label']}: {desc}{run}{now}")
        self._update_buttons()

    # ---- actions ----------------------------------------------------------------------------
    def open_run(self) -> None:
        p = self.selected_point()
        if p is not None and p.get("run_id"):
            self.runActivated.emit(int(p["run_id"]))

    def apply_selected(self) -> bool:
        """Give the project the selected point's settings: one undoable step."""
        p = self.selected_point()
        project = self.ctl.project
        if p is None or project is None:
            return False
        try:
            edits = apply_point_edits(project, p["settings"])
            if not edits:
                self.ctl.message.emit("info", f"The project already has {p['label']}'s "
                                              "settings.")
                return False
            self.ctl.apply_as_one(edits, apply_point_label(p))
        except StudioError as exc:
            self.ctl.message.emit("error", f"Cannot apply {p['label']}: {exc.message}")
            return False
        self.ctl.message.emit("info", f"Applied {p['label']} to the project "
                                      f"({Point(p['index'], p['settings']).describe()}); "
                                      "Edit ▸ Undo takes it back.")
        return True

    def write_report(self) -> None:
        if self.rec is None or self.ctl.project is None:
            return
        try:
            out = write_sweep_report(self.ctl.project, self.rec)
        except OSError as exc:
            self.ctl.message.emit("error", f"Cannot write the sweep report: {exc}")
            return
        self.ctl.message.emit("info", f"Wrote {out}")

    def _update_buttons(self) -> None:
        has = self.ctl.studio is not None and self.current_name() is not None
        running = self.running
        pipeline = self.ctl.running
        declared = has and self._declared(self.current_name())
        waiting = self._queued()
        self.run_button.setEnabled(has and declared and not running and waiting is None
                                   and self._spec is not None)
        self.run_button.setText("Queue sweep" if pipeline else "Run sweep")
        self.run_button.setToolTip(
            f"Queued as #{waiting.id}: cancel it on the Queue page to change it"
            if waiting is not None else
            "The pipeline is running: the sweep is queued and starts when it ends" if pipeline
            else "Run every point through the pipeline (points that share a stage share its "
                 "job; finished jobs come from the store)")
        if waiting is not None and not running:
            self.status.setText(f"Queued as #{waiting.id}: "
                                f"{self.ctl.queue.why.get(waiting.id, 'it waits its turn')}")
        if not running:
            self.cancel_button.setEnabled(False)
        else:
            self.cancel_button.setEnabled(self.sweep is not None and not self.sweep.cancel_asked)
        self.combo.setEnabled(not running)
        self.workers.setEnabled(not running)
        p = self.selected_point()
        self.open_button.setEnabled(p is not None and bool(p.get("run_id")))
        ok = p is not None and p["state"] != "invalid"
        self.apply_button.setEnabled(ok)
        self.apply_button.setText(f"Apply {p['label']} to project" if p is not None
                                  else "Apply to project")
        self.apply_button.setToolTip(
            "" if p is None else
            f"{p['label']} is invalid: {p['reason']}" if p["state"] == "invalid" else
            "Give the project this point's settings — one step: Edit ▸ Undo reverts all of it")
        self.report_button.setEnabled(self.rec is not None and not running
                                      and self.rec.get("state") != "not run")


def main() -> int:
    return run_page(SweepsPage)


if __name__ == "__main__":
    raise SystemExit(main())
