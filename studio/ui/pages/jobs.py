"""Jobs: the run history as a live table, run / cancel / retry, and the selected job's log."""

from __future__ import annotations

from PySide6.QtCore import QItemSelectionModel, Qt, QTimer, Signal
from PySide6.QtGui import QAction, QFont, QFontDatabase
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QMenu,
    QPlainTextEdit,
    QPushButton,
    QSplitter,
    QTableView,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from studio.core.errors import StudioError
from studio.core.jobs import FINAL, Job
from studio.services import joblog
from studio.ui.models.jobs import (
    C_ELAPSED,
    C_ID,
    C_PROGRESS,
    C_RESULT,
    C_RUN,
    C_STAGE,
    C_STATE,
    C_TARGET,
    STATE_GROUPS,
    JobFilter,
    JobRole,
    JobsModel,
)
from studio.ui.pages.base import Page
from studio.ui.stages import project_stage, project_stages, stage_help
from studio.ui.standalone import run_page
from studio.ui.widgets import EmptyState, ProgressDelegate, label

ALL_STAGES = "All stages"
EMPTY_TEXT = (
    "“Run pipeline” queues exactly the jobs that <code>studio --batch</code> runs for this "
    "project: {stages}, for each target (and each device for run and profile). “Run stage” "
    "runs one stage and what it needs. Stages whose inputs and settings did not change come "
    "back from the cache at once."
)


def _clean(line: str) -> str:
    """A terminal progress line rewritten with carriage returns: keep what it ended as
    (and no terminal colour codes)."""
    line = joblog.plain(line)
    if "\r" in line:
        parts = [p for p in line.split("\r") if p.strip()]
        return parts[-1] if parts else ""
    return line


class JobsPage(Page):
    key = "jobs"
    error = Signal(str)

    def __init__(self, ctl, parent=None):
        super().__init__(ctl, parent)
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(0, 6, 0, 0)
        lay.addLayout(self._build_toolbar())
        self.plan_label = label("", "muted", wrap=True)
        lay.addWidget(self.plan_label)
        self.table_stack = QWidget()
        ts = QVBoxLayout(self.table_stack)
        ts.setContentsMargins(0, 0, 0, 0)
        ts.addWidget(self._build_table())
        ts.addWidget(self._build_empty())
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.table_stack)
        split.addWidget(self._build_log())
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        lay.addWidget(split, 1)

        self._log_job: int | None = None  # the job whose log the pane shows
        self._log_count = 0  # how many of its stored lines the pane shows
        self._log_events: dict[int, int] = {}  # job id -> log lines received as events
        self._selecting = False
        self._pending: list[str] = []
        self._flush = QTimer(self)
        self._flush.setInterval(100)
        self._flush.timeout.connect(self._flush_log)
        self._ticker = QTimer(self)
        self._ticker.setInterval(1000)
        self._ticker.timeout.connect(self.model.tick)

        ctl.log_line.connect(self._on_log)
        ctl.running_changed.connect(self._update_buttons)
        ctl.running_changed.connect(self._run_started)
        self._update_buttons()

    # ---- building the page ----------------------------------------------------------------
    def _build_toolbar(self) -> QHBoxLayout:
        """Run, run one stage, cancel, retry; the filters of the table."""
        bar = QHBoxLayout()
        self.run_button = QPushButton("▶  Run pipeline")
        self.run_button.setDefault(True)
        self.run_button.clicked.connect(lambda: self.run_stages(None))
        bar.addWidget(self.run_button)
        self.stage_button = QToolButton()
        self.stage_button.setText("Run stage")
        self.stage_button.setPopupMode(QToolButton.ToolButtonPopupMode.InstantPopup)
        self.stage_button.setToolTip(
            "Run one stage (and the stages it needs, cached when unchanged)"
        )
        self.stage_menu = QMenu(self.stage_button)
        self.stage_actions: dict[str, QAction] = {}  # the project's stages (_fill_stages)
        self.stage_button.setMenu(self.stage_menu)
        bar.addWidget(self.stage_button)
        bar.addSpacing(12)
        self.cancel_button = QPushButton("Cancel job")
        self.cancel_button.clicked.connect(self.cancel_selected)
        bar.addWidget(self.cancel_button)
        self.cancel_run_button = QPushButton("Cancel run")
        self.cancel_run_button.clicked.connect(self.ctl.cancel_run)
        self.cancel_run_button.setToolTip("Cancel every queued and running job of this run")
        bar.addWidget(self.cancel_run_button)
        self.retry_button = QPushButton("Retry")
        self.retry_button.clicked.connect(self.retry_selected)
        bar.addWidget(self.retry_button)
        bar.addStretch(1)
        self.state_filter = QComboBox()
        self.state_filter.addItems(list(STATE_GROUPS))
        self.state_filter.currentTextChanged.connect(self._filters_changed)
        self.state_filter.setToolTip("Show jobs in these states")
        bar.addWidget(self.state_filter)
        self.stage_filter = QComboBox()
        self.stage_filter.addItem(ALL_STAGES)
        self.stage_filter.currentTextChanged.connect(self._filters_changed)
        bar.addWidget(self.stage_filter)
        self.latest_only = QCheckBox("Latest run only")
        self.latest_only.toggled.connect(self._filters_changed)
        bar.addWidget(self.latest_only)
        self.search = QLineEdit()
        self.search.setPlaceholderText("Filter jobs…")
        self.search.setToolTip("Show the jobs whose stage, target or message holds this text")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self._filters_changed)
        self.search.setMinimumWidth(self.search.fontMetrics().horizontalAdvance("Filter jobs…")
                                    + 40)  # the placeholder and the clear button
        self.search.setMaximumWidth(220)
        bar.addWidget(self.search)
        return bar

    def _build_table(self) -> QTableView:
        """The jobs, live: one row per job, newest first."""
        self.model = JobsModel(self)
        self.proxy = JobFilter(self)
        self.proxy.setSourceModel(self.model)
        self.table = QTableView()
        self.table.setModel(self.proxy)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setItemDelegateForColumn(C_PROGRESS, ProgressDelegate(self.table))
        self.table.verticalHeader().hide()
        self.table.setAlternatingRowColors(True)
        self.table.setWordWrap(False)
        hh = self.table.horizontalHeader()
        for col, mode in (
            (C_RUN, QHeaderView.ResizeMode.ResizeToContents),
            (C_ID, QHeaderView.ResizeMode.ResizeToContents),
            (C_STAGE, QHeaderView.ResizeMode.ResizeToContents),
            (C_TARGET, QHeaderView.ResizeMode.Interactive),
            (C_STATE, QHeaderView.ResizeMode.ResizeToContents),
            (C_PROGRESS, QHeaderView.ResizeMode.Fixed),
            (C_ELAPSED, QHeaderView.ResizeMode.ResizeToContents),
            (C_RESULT, QHeaderView.ResizeMode.Stretch),
        ):
            hh.setSectionResizeMode(col, mode)
        hh.resizeSection(C_PROGRESS, 130)
        hh.resizeSection(C_TARGET, 190)
        self.table.selectionModel().selectionChanged.connect(self._selection_changed)
        self.table.clicked.connect(self._row_clicked)
        return self.table

    def _build_empty(self) -> EmptyState:
        """Before the first job: what Run pipeline queues (the text names the open project's
        stages, ``_fill_stages``)."""
        self.empty = EmptyState("No jobs yet", "")
        self.empty.add_action("▶  Run pipeline", lambda: self.run_stages(None))
        self.first_button = self.empty.add_action(
            "Run export + quantize",
            lambda: self.run_role("quantize"),
            "The first two stages: the FP32 ONNX graphs, then the quantized ones",
        )
        return self.empty

    def _build_log(self) -> QWidget:
        """The log of the followed or picked job."""
        log_box = QWidget()
        ll = QVBoxLayout(log_box)
        ll.setContentsMargins(0, 0, 0, 0)
        head = QHBoxLayout()
        self.log_title = label("Log", "muted")
        head.addWidget(self.log_title, 1)
        self.follow_button = QCheckBox("Follow running job")
        self.follow_button.setChecked(True)
        self.follow_button.setToolTip(
            "On: the log shows the job that is running, switching as the run goes on.\n"
            "Clicking another job's row pins the log to that job and turns this off; "
            "turn it on again to go back to the running job. A new run turns it on."
        )
        self.follow_button.toggled.connect(self._follow_toggled)
        head.addWidget(self.follow_button)
        self.raw_button = QCheckBox("Raw")
        self.raw_button.setToolTip(
            "Off: the job's own lines and its progress, timed from its start.\n"
            "On: every line it wrote, with the libraries' warnings and start-up notices "
            "(ONNX Runtime, QNN, torch)."
        )
        self.raw_button.toggled.connect(self._raw_toggled)
        head.addWidget(self.raw_button)
        ll.addLayout(head)
        self.log = QPlainTextEdit()
        self.log.setReadOnly(True)
        self.log.setMaximumBlockCount(20000)
        self.log.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        font = QFontDatabase.systemFont(QFontDatabase.SystemFont.FixedFont)
        font.setStyleHint(QFont.StyleHint.Monospace)
        self.log.setFont(font)
        self.log.setPlaceholderText(NO_JOB_TEXT)
        ll.addWidget(self.log)
        return log_box

    def _fill_stages(self) -> None:
        """The Run stage menu and the stage filter: the stages of the open project's kind;
        the empty state names the project's pipeline."""
        project = self.ctl.project
        self.stage_menu.clear()
        self.stage_actions = {}
        for s in project_stages(project):
            act = self.stage_menu.addAction(f"{s} — {stage_help(s)}")
            act.triggered.connect(lambda _=False, s=s: self.run_stages([s]))
            self.stage_actions[s] = act
        current = self.stage_filter.currentText()
        self.stage_filter.blockSignals(True)
        self.stage_filter.clear()
        self.stage_filter.addItems([ALL_STAGES, *project_stages(project)])
        self.stage_filter.setCurrentIndex(max(0, self.stage_filter.findText(current)))
        self.stage_filter.blockSignals(False)
        if project is None:
            return
        first = project_stage(project, "export")
        self.first_button.setText(f"Run {first} + quantize")
        self.empty.set_text("No jobs yet", EMPTY_TEXT.format(
            stages=" → ".join(project.pipeline["stages"])))

    # ---- session ------------------------------------------------------------------------------
    def on_open(self) -> None:
        self._fill_stages()
        self.model.reset(self.ctl.studio.jobs.jobs(limit=500))
        self._clear_log()
        self.follow_button.setChecked(True)
        self._update_plan()
        self._update_empty()
        self._update_buttons()

    def on_show(self) -> None:
        if self.ctl.running:
            return
        jobs = self.ctl.studio.jobs.jobs(limit=500)
        if [(j.id, j.state) for j in jobs] != [
            (j.id, j.state) for j in sorted(self.model.jobs(), key=lambda j: -j.id)
        ]:
            self.model.reset(jobs)  # another process (studio --batch) ran jobs
            self._update_empty()

    def on_close(self) -> None:
        self.model.clear()
        self._clear_log()
        self._ticker.stop()
        self._flush.stop()

    def on_change(self, change) -> None:
        if any(sec in ("", "pipeline", "run") for sec, _ in change):
            self._update_plan()
        if any(sec == "pipeline" for sec, _ in change):
            self._fill_stages()

    def _update_plan(self) -> None:
        try:
            jobs = self.ctl.plan()
        except StudioError as exc:
            self.plan_label.setText(f"Pipeline: {exc.message}")
            return
        labels = [j.label for j in jobs]
        self.plan_label.setText(
            f"Run pipeline queues {len(jobs)} jobs (as studio --batch): " + " → ".join(labels)
        )
        self.run_button.setToolTip(
            "Queue the project's whole pipeline, exactly the jobs of studio --batch:\n"
            + "\n".join(labels)
        )

    def _update_empty(self) -> None:
        has = self.model.rowCount() > 0
        self.table.setVisible(has)
        self.empty.setVisible(not has)

    # ---- actions --------------------------------------------------------------------------------
    def selected_job(self) -> Job | None:
        rows = self.table.selectionModel().selectedRows()
        if not rows:
            return None
        job = rows[0].data(JobRole)
        if job is None:
            return None
        row = self.model.row_of(job.id)
        return self.model.job_at(row) if row is not None else job

    def reveal_job(self, job_id: int) -> bool:
        """Select the job's row and show its log."""
        if not self.select_job(job_id):
            return False
        self.show_log(self.ctl.studio.jobs.job(job_id))
        return True

    def select_job(self, job_id: int) -> bool:
        """Select a job's row as a click on it does: its log shows, and a job other than the
        running one pins the log (following stops). Filters that hide the row are cleared."""
        if not self._select_row(job_id, reveal=True):
            return False
        job = self.selected_job()
        if job is not None:
            self._user_chose(job)
        return True

    def _select_row(self, job_id: int, reveal: bool) -> bool:
        """Select a row without the side effects of a user's choice. A row the filters hide is
        shown (``reveal``) or the selection is cleared."""
        row = self.model.row_of(job_id)
        if row is None:
            return False
        idx = self.proxy.mapFromSource(self.model.index(row, 0))
        if not idx.isValid() and reveal:  # filtered out: show everything
            self.state_filter.setCurrentIndex(0)
            self.stage_filter.setCurrentIndex(0)
            self.latest_only.setChecked(False)
            self.search.clear()
            idx = self.proxy.mapFromSource(self.model.index(row, 0))
        self._selecting = True
        try:
            if idx.isValid():
                self.table.selectionModel().select(
                    idx,
                    QItemSelectionModel.SelectionFlag.ClearAndSelect
                    | QItemSelectionModel.SelectionFlag.Rows,
                )
            else:
                self.table.selectionModel().clearSelection()
        finally:
            self._selecting = False
        if idx.isValid():
            self.table.scrollTo(idx)
        self._update_buttons()
        return idx.isValid()

    def cancel_selected(self) -> None:
        job = self.selected_job()
        if job is not None:
            self.ctl.cancel(job.id)

    def retry_selected(self):
        job = self.selected_job()
        if job is None:
            return None
        try:
            return self.ctl.retry(job)
        except StudioError as exc:
            self.ctl.message.emit("error", exc.message)
            return None

    def _run_started(self, running: bool) -> None:
        if running and self.model.rowCount() == 0:
            self.empty.set_text(
                "Planning the run…",
                "Working out each job's key (the project's inputs are hashed): the jobs "
                "appear here in a moment, those whose inputs and settings did not change "
                "straight from the cache.")
        elif not running and self.ctl.project is not None:
            self._fill_stages()
        if running and not self.following:
            # a new run: watch it from its first job on (the pane switches when it starts)
            self.follow_button.blockSignals(True)
            self.follow_button.setChecked(True)
            self.follow_button.blockSignals(False)
            job = self._shown_job()
            if job is not None:
                self._update_log_title(job)

    def _update_buttons(self, *_args) -> None:
        has_project = self.ctl.studio is not None
        running = self.ctl.running
        job = self.selected_job() if has_project else None
        active = bool(job and job.state in ("queued", "running") and running)
        # a run while one runs is queued behind it (the Queue page says why it waits)
        self.run_button.setEnabled(has_project)
        self.run_button.setText("＋  Queue a run" if running else "▶  Run pipeline")
        self.run_button.setToolTip(
            "A run is going: another run waits in the queue until it ends" if running else
            "Run every stage of the project (unchanged stages come from the cache)")
        self.stage_button.setEnabled(has_project)
        self.stage_button.setToolTip(
            "Queue one stage (and the stages it needs) behind the run that is going"
            if running else "Run one stage (and the stages it needs, cached when unchanged)")
        self.cancel_button.setEnabled(active)
        self.cancel_button.setToolTip(
            f"Cancel {job.label} (a running worker is terminated)"
            if active
            else "Select a queued or running job to cancel it"
        )
        self.cancel_run_button.setEnabled(running)
        can_retry = bool(job and job.state in ("failed", "cancelled", "interrupted"))
        self.retry_button.setEnabled(can_retry)
        if can_retry:
            self.retry_button.setToolTip(f"Run {job.stage} again (its inputs come from the cache)")
        else:
            self.retry_button.setToolTip(
                "Select a failed, cancelled or interrupted job to retry it"
            )
        if running:
            self._ticker.start()
        else:
            self._ticker.stop()

    def _filters_changed(self, *_args) -> None:
        group = STATE_GROUPS.get(self.state_filter.currentText())
        stage = self.stage_filter.currentText()
        self.proxy.set_filter(
            states=group,
            stage=None if stage == ALL_STAGES else stage,
            latest_only=self.latest_only.isChecked(),
            text=self.search.text(),
        )

    # ---- events -----------------------------------------------------------------------------------
    def on_job_event(self, job: Job) -> None:
        self.model.upsert(job)
        if not self.table.isVisible() and self.model.rowCount():
            self._update_empty()
        if job.state == "running" and self.following and job.id != self._log_job:
            self._follow(job)
        elif job.id == self._log_job and job.state in FINAL:
            self._log_finished(job)
        elif job.id == self._log_job:
            self._update_log_title(job)
        sel = self.selected_job()
        if sel is not None and sel.id == job.id:
            self._update_buttons()

    def _on_log(self, job_id: int, line: str) -> None:
        # The service stores each line before it sends it: a log loaded from the store may
        # already hold lines whose events are still on their way. Count them to skip those.
        n = self._log_events[job_id] = self._log_events.get(job_id, 0) + 1
        if job_id == self._log_job and n > self._log_count:
            self._log_count = n
            if not self.raw_button.isChecked() and joblog.is_noise(line):
                return
            self._pending.append(_clean(line))
            if not self._flush.isActive():
                self._flush.start()

    def _flush_log(self) -> None:
        if self._pending:
            self.log.appendPlainText("\n".join(self._pending))
            self._pending.clear()
        else:
            self._flush.stop()

    # ---- which job the log shows -------------------------------------------------------------------
    @property
    def following(self) -> bool:
        """Whether the log follows the running job (else it is pinned to the job shown)."""
        return self.follow_button.isChecked()

    def running_job(self) -> Job | None:
        return next((j for j in self.ctl.active_jobs if j.state == "running"), None)

    def _follow(self, job: Job) -> None:
        """Show the running job: its row is selected (when no filter hides it), its log loads."""
        self._select_row(job.id, reveal=False)
        if job.id != self._log_job:
            self._load_log(job)

    def _follow_toggled(self, on: bool) -> None:
        if on and self.ctl.studio is not None:
            job = self.running_job() or self._latest_started()
            if job is not None:
                self._follow(job)
        job = self._shown_job()
        if job is not None:
            self._update_log_title(job)

    def _shown_job(self) -> Job | None:
        row = self.model.row_of(self._log_job) if self._log_job is not None else None
        return self.model.job_at(row) if row is not None else None

    def _latest_started(self) -> Job | None:
        started = [j for j in self.model.jobs() if j.started is not None]
        return max(started, key=lambda j: (j.started, j.id)) if started else None

    def _user_chose(self, job: Job) -> None:
        """The user picked a job: a job other than the running one pins the log to it."""
        running = self.running_job()
        if self.following and (running is None or running.id != job.id):
            self.follow_button.setChecked(False)
        if job.id != self._log_job:
            self._load_log(job)
        else:
            self._update_log_title(job)

    def _selection_changed(self, *_args) -> None:
        self._update_buttons()
        if self._selecting:
            return
        job = self.selected_job()
        if job is not None:  # None: the filters hid the row, the user chose nothing
            self._user_chose(job)

    def _row_clicked(self, index) -> None:
        job = index.data(JobRole)
        if job is not None:
            row = self.model.row_of(job.id)
            self._user_chose(self.model.job_at(row) if row is not None else job)

    def show_log(self, job: Job) -> None:
        """Show a job's log, as chosen by the user (a job other than the running one pins it)."""
        self._user_chose(job)
        if job.id == self._log_job:
            self._load_log(job)

    def _clear_log(self) -> None:
        self._flush.stop()
        self._pending.clear()
        self._log_job = None
        self._log_count = 0
        self._log_events.clear()
        self.log.clear()
        self.log.setPlaceholderText(NO_JOB_TEXT)
        self.log_title.setText("Log")

    def _load_log(self, job: Job) -> None:
        """Load a job's log from the run history; a running job's new lines then stream in."""
        self._flush.stop()
        self._pending.clear()
        self._log_job = job.id
        lines = self.ctl.studio.jobs.log(job.id)
        self._log_count = len(lines)
        shown = lines if self.raw_button.isChecked() else joblog.readable(lines)
        text = "\n".join(_clean(x) for x in shown)
        if job.state == "failed" and job.error and job.error not in text:
            text = f"{text}\n✖ {job.error}" if text else f"✖ {job.error}"
        self.log.setPlainText(text)
        self.log.setPlaceholderText(empty_log_text(job, hidden=len(lines) - len(shown)))
        self._to_last_line()
        self._update_log_title(job)

    def _to_last_line(self) -> None:
        """The end of the log in view, from the start of its last line (a long last line
        never leaves the pane scrolled sideways)."""
        ops = self.log.textCursor().MoveOperation
        self.log.moveCursor(ops.End)
        self.log.moveCursor(ops.StartOfLine)
        self.log.horizontalScrollBar().setValue(0)

    def _raw_toggled(self, _on: bool) -> None:
        job = self._shown_job()
        if job is not None:
            self._load_log(job)

    def _log_finished(self, job: Job) -> None:
        """The shown job ended: make sure the pane holds its whole stored log."""
        self._flush_log()
        self._flush.stop()
        if len(self.ctl.studio.jobs.log(job.id)) != self._log_count:
            self._load_log(job)  # e.g. a crash's traceback, stored without an event
            return
        if job.state == "failed" and job.error and job.error not in self.log.toPlainText():
            self.log.appendPlainText(f"✖ {job.error}")
        self.log.setPlaceholderText(empty_log_text(job))
        self._to_last_line()
        self._update_log_title(job)

    def _update_log_title(self, job: Job) -> None:
        how = "following the running job" if self.following else "pinned"
        self.log_title.setText(f"Log of #{job.id} {job.label} — {job.state} · {how}")


NO_JOB_TEXT = "Select a job to see its log; the running job's log streams here."


def empty_log_text(job: Job, hidden: int = 0) -> str:
    """What the log pane says while a job's log has no line (``hidden``: lines of library
    noise the readable view leaves out)."""
    if hidden:
        return (f"{hidden} line{'s' if hidden != 1 else ''} of library output (warnings, "
                "start-up notices) and nothing else: tick Raw to read them.")
    if job.state == "queued":
        return "Queued: its log appears here when it starts."
    if job.state == "running":
        return "Running: waiting for its first log line…"
    if job.cached:
        return (
            "No log lines were recorded for this job: its result came from the cache "
            "(inputs and settings unchanged)."
        )
    if job.started is None:
        return "No log lines were recorded for this job: it never started."
    return "No log lines were recorded for this job."


def main() -> int:
    return run_page(JobsPage)


if __name__ == "__main__":
    raise SystemExit(main())
