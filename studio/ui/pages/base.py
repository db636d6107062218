"""What every page shares: the controller, a header, the no-project state, and a way to open
the page alone with sample data (``python -m studio.ui.pages.<name>``).

``StagePage`` is a page that shows the latest jobs of one stage (an empty state until there
are some), marked stale where the project has changed since they ran (the same rule as the
Overview: :func:`studio.services.history.stale_reasons`); ``TargetStagePage`` adds a target
picker that shows one of those jobs at a time."""

from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QPushButton,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from studio.core.errors import StudioError
from studio.core.jobs import Job
from studio.services import history
from studio.ui.controller import ProjectController
from studio.ui.loading import LatestLoad
from studio.ui.pages.cards import STALE_COLOR
from studio.ui.pages.registry import page_spec
from studio.ui.stages import article, project_kind, project_stage, role_of
from studio.ui.widgets import EmptyState, SourceBadge, label


class Page(QWidget):
    """A page of the main window. Its key names its declaration in
    :data:`studio.ui.pages.registry.PAGES` (title, description); the hooks below are what
    the window and the controller call, each a no-op unless the page overrides it."""

    #: the page's key in the registry
    key = ""
    #: False: the page shows its body with no project open too (the devices, the queue)
    needs_project = True
    #: ask the window to show another page (its key), or "action:new" / "action:open"
    navigate = Signal(str)
    #: ask the window to show a layer (module path or key-activation pseudo-layer) where
    #: layers are edited (the Precision page)
    layerActivated = Signal(str)
    #: ask the window to show a run of the history
    runActivated = Signal(int)
    #: ask the window to show a layer's nodes in the graph view (Model page)
    graphActivated = Signal(str)

    def __init__(self, ctl: ProjectController, parent: QWidget | None = None):
        super().__init__(parent)
        self.ctl = ctl
        spec = page_spec(self.key)
        #: the name in the navigation and over the page; the line under it
        self.title, self.subtitle = spec.title, spec.description
        outer = QVBoxLayout(self)
        outer.setContentsMargins(16, 12, 16, 12)
        head = QHBoxLayout()
        titles = QVBoxLayout()
        titles.setSpacing(0)
        self.title_label = label(self.title, "title")
        self.subtitle_label = label(self.subtitle, "subtitle", wrap=True)
        titles.addWidget(self.title_label)
        titles.addWidget(self.subtitle_label)
        head.addLayout(titles, 1)
        self.header_tools = QHBoxLayout()
        head.addLayout(self.header_tools)
        outer.addLayout(head)
        self.stack = QStackedWidget()
        outer.addWidget(self.stack, 1)
        self.no_project = EmptyState(
            "No project open",
            "Create a project (File ▸ New Project…, Ctrl+N) from the sample model, a Hugging "
            "Face checkpoint folder or an ONNX file, or open an existing .qstudio file.",
        )
        self.no_project.add_action("New project…", lambda: self.navigate.emit("action:new"))
        self.no_project.add_action("Open…", lambda: self.navigate.emit("action:open"))
        self.stack.addWidget(self.no_project)
        self.body = QWidget()
        self.stack.addWidget(self.body)
        self._refresh_pending = False
        ctl.opened.connect(self._on_opened)
        ctl.closed.connect(self._on_closed)
        ctl.changed.connect(self._on_changed)
        ctl.job_event.connect(self._on_job_event)

    # ---- lifecycle --------------------------------------------------------------------------
    def _on_opened(self) -> None:
        self.stack.setCurrentWidget(self.body)
        self.on_open()

    def _on_closed(self) -> None:
        self.stack.setCurrentWidget(self.no_project if self.needs_project else self.body)
        self.on_close()

    def _on_changed(self, change) -> None:
        if self.ctl.studio is not None:
            self.on_change(change)

    def _on_job_event(self, job: Job) -> None:
        if self.ctl.studio is not None:
            self.on_job_event(job)

    def start(self) -> None:
        """Called once after construction: show the session's current state."""
        if self.ctl.studio is not None:
            self._on_opened()
        else:
            self._on_closed()

    def later(self, fn, ms: int = 150) -> None:
        """Coalesce bursts of events into one refresh."""
        if self._refresh_pending:
            return
        self._refresh_pending = True

        def go() -> None:
            self._refresh_pending = False
            if self.ctl.studio is not None:
                fn()

        QTimer.singleShot(ms, go)

    def showEvent(self, event) -> None:
        super().showEvent(event)
        if self.ctl.studio is not None and self.stack.currentWidget() is self.body:
            self.on_show()

    def run_stages(self, stages: list[str] | None):
        """Run ``stages`` (None: the whole pipeline); a StudioError becomes an error message.
        Returns the task, or None when nothing started."""
        try:
            return self.ctl.run(stages)
        except StudioError as exc:
            self.ctl.message.emit("error", exc.message)
            return None

    def run_role(self, role: str):
        """Run the project's stage of ``role`` (and what it needs); a kind without one gets
        an error message. Returns the task, or None when nothing started."""
        stage = project_stage(self.ctl.project, role)
        if not stage:
            kind = project_kind(self.ctl.project)
            self.ctl.message.emit("error", f"{article(kind)} {kind} project has no {role} stage")
            return None
        return self.run_stages([stage])

    # ---- hooks: the controller's events (while a project is open) -----------------------
    def on_show(self) -> None:
        """The page became visible: re-read what another process (studio --batch) may have
        added to the run history."""

    def on_open(self) -> None:
        """A project was opened (also when the page is built while one is open)."""

    def on_close(self) -> None:
        """The project was closed."""

    def on_change(self, change) -> None:
        """A command changed the project: ``change`` holds the (section, key) pairs."""

    def on_job_event(self, job: Job) -> None:
        """A job of the open project was queued, progressed or ended."""

    # ---- hooks: what the window asks of a page ----------------------------------------------
    def apply_theme(self) -> None:
        """The theme changed: redraw what the palette does not reach (plots)."""

    def reveal_layer(self, name: str) -> bool:
        """Show and select the layer ``name``; False where the page has no layers."""
        return False

    def reveal_run(self, run_id: int) -> bool:
        """Show run ``run_id`` of the history; False where the page cannot."""
        return False

    def reveal_job(self, job_id: int) -> bool:
        """Show the job ``job_id`` (its log); False where the page cannot."""
        return False


class StagePage(Page):
    """A page about one stage: ``empty`` (an EmptyState) until the run history holds a
    succeeded job of the stage, then ``content``. Subclasses set ``role``, fill
    ``content_layout`` and draw the jobs in ``show_jobs``."""

    #: the role (``core.stagegraph``) of the stage whose latest succeeded jobs the page shows:
    #: the open project's stage of that role (``validate`` or ``graph-validate`` …)
    role = ""
    #: how long to coalesce job events before refreshing (ms)
    refresh_ms = 150

    def __init__(
        self, ctl: ProjectController, empty_title: str, empty_text: str, parent=None
    ) -> None:
        super().__init__(ctl, parent)
        self.body_layout = QVBoxLayout(self.body)
        self.body_layout.setContentsMargins(0, 6, 0, 0)
        self.empty = EmptyState(empty_title, empty_text)
        self.body_layout.addWidget(self.empty)
        self.content = QWidget()
        self.content_layout = QVBoxLayout(self.content)
        self.content_layout.setContentsMargins(0, 0, 0, 0)
        self.body_layout.addWidget(self.content, 1)
        # which shown jobs no longer match the project (its settings, inputs or the code)
        self.stale_note = label("", wrap=True)
        self.stale_note.setStyleSheet(f"color: {STALE_COLOR};")
        self.stale_note.hide()
        self.content_layout.addWidget(self.stale_note)
        #: job id -> why its figures no longer match the project (only the stale ones)
        self.stale: dict[int, str] = {}
        self._stale_load = LatestLoad(ctl)
        self._stale_timer = QTimer(self)  # a burst of edits: one check
        self._stale_timer.setSingleShot(True)
        self._stale_timer.setInterval(300)
        self._stale_timer.timeout.connect(self.check_stale)
        ctl.changed.connect(lambda _change: self._stale_timer.start())
        self._jobs: list[Job] = []
        self._empty_title = empty_title
        self._run_buttons: list[QPushButton] = []
        ctl.running_changed.connect(lambda _running: self._show_running())

    def add_run_action(self, text: str, tip: str) -> QPushButton:
        """The empty state's button that runs the page's stage: while that stage runs it is
        disabled and the empty state says so (not "No … yet" beside a live button)."""
        b = self.empty.add_action(text, self.run_stage, tip)
        b.setProperty("run_tip", tip)
        self._run_buttons.append(b)
        return b

    def _show_running(self) -> None:
        role = self.role
        busy = bool(role) and any(role_of(j.stage) == role for j in self.ctl.active_jobs)
        self.empty.title.setText(
            f"{self._empty_title}: the {self.stage or role} stage is running now" if busy
            else self._empty_title)
        for b in self._run_buttons:
            b.setEnabled(not busy)
            b.setToolTip("It is running now: its progress is on the Jobs page" if busy
                         else b.property("run_tip"))

    @property
    def stage(self) -> str:
        """The open project's stage of the page's role ("" without a project, or when the
        project's kind has no such stage)."""
        return project_stage(self.ctl.project, self.role)

    def on_show(self) -> None:
        self.refresh()

    def on_open(self) -> None:
        self.refresh()

    def on_job_event(self, job: Job) -> None:
        if role_of(job.stage) == self.role:
            self._show_running()
        if job.state == "succeeded" and role_of(job.stage) == self.role:
            self.later(self.refresh, self.refresh_ms)

    def run_stage(self) -> None:
        """Run the page's stage (and what it needs)."""
        self.run_role(self.role)

    def set_has_content(self, has: bool) -> bool:
        """Show ``content`` if ``has``, else the empty state; returns ``has``."""
        self.empty.setVisible(not has)
        self.content.setVisible(has)
        return has

    def sort_key(self, job: Job):
        """The order of the jobs (one per target)."""
        return job.target

    def refresh(self) -> None:
        stage = self.stage
        jobs = history.latest_jobs(self.ctl.studio.jobs, stage) if stage else []
        self._jobs = sorted(jobs, key=self.sort_key)
        if self.set_has_content(bool(self._jobs)):
            self.show_jobs(self._jobs)
        self.check_stale()

    def show_jobs(self, jobs: list[Job]) -> None:
        """Draw ``jobs`` (never empty)."""
        raise NotImplementedError

    # ---- stale figures ------------------------------------------------------------------
    def check_stale(self):
        """Compute the keys the project gives the shown jobs' stage now, in a thread (it
        hashes the input files), then mark the jobs whose figures no longer match it.
        Returns the task (None when nothing is shown)."""
        studio = self.ctl.studio
        shown = list(self._jobs)
        if studio is None or not shown:
            self._stale_load.drop()
            self._apply_stale({}, "")
            return None
        project = studio.project.copy()
        stages = sorted({j.stage for j in shown})

        def done(keys: dict[str, str]) -> None:
            s = self.ctl.studio
            # the job the project's current recipe gave, where there is one (the Overview's
            # choice): one value per figure on every page
            chosen = sorted(history.current_jobs(s.jobs, self.stage, keys, s.store),
                            key=self.sort_key) if self.stage else shown
            now = shown
            if [j.id for j in chosen] != [j.id for j in shown] and chosen:
                self._jobs = now = chosen
                self.show_jobs(self._jobs)
            self._apply_stale(history.stale_reasons(project, s.jobs, now, keys, s.store), "")

        def failed(exc: Exception) -> None:
            why = exc.message if isinstance(exc, StudioError) else str(exc)
            self._apply_stale({}, f"Cannot tell whether these figures match the project now: "
                                  f"{why}")

        return self._stale_load.start(history.current_keys, project, stages, done=done,
                                      failed=failed)

    def _apply_stale(self, reasons: dict[int, str], note: str) -> None:
        self.stale = dict(reasons)
        stale = [j for j in self._jobs if j.id in reasons]
        if stale:
            note = ("⚠ Stale — made with an older recipe or other inputs than the project "
                    "holds now: " + "; ".join(f"{j.label} of run {j.run_id} ({reasons[j.id]})"
                                              for j in stale)
                    + ". Run the stage again to update them.")
        self.stale_note.setText(note)
        self.stale_note.setVisible(bool(note))
        self.mark_stale(self.stale)

    def mark_stale(self, reasons: dict[int, str]) -> None:
        """Mark the drawn figures of the jobs in ``reasons`` stale (job id -> why); the page's
        note already lists them. A no-op unless the page draws cards of its own."""


class TargetStagePage(StagePage):
    """A StagePage that shows one job at a time, picked by target: the head row of
    ``content`` holds the ``target`` combo box, ``job_label`` and a source ``badge``;
    subclasses draw the picked job in ``show_job``."""

    def __init__(
        self, ctl: ProjectController, empty_title: str, empty_text: str, parent=None
    ) -> None:
        super().__init__(ctl, empty_title, empty_text, parent)
        head = QHBoxLayout()
        head.addWidget(label("Target:"))
        self.target = QComboBox()
        self.target.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.target.currentIndexChanged.connect(self.show_current)
        head.addWidget(self.target)
        self.job_label = label("", "muted")
        head.addWidget(self.job_label, 1)
        self.badge = SourceBadge("simulated")
        head.addWidget(self.badge)
        self.content_layout.addLayout(head)

    def show_jobs(self, jobs: list[Job]) -> None:
        current = self.target.currentData()
        self.target.blockSignals(True)
        self.target.clear()
        for j in jobs:
            self.target.addItem(j.target, j.id)
        self.target.setCurrentIndex(max(0, self.target.findData(current)))
        self.target.blockSignals(False)
        self.show_current()

    def show_current(self, *_args) -> None:
        """Draw the job of the picked target again."""
        if self.ctl.studio is None or not self._jobs:
            return
        jid = self.target.currentData()
        self.show_job(next((j for j in self._jobs if j.id == jid), self._jobs[0]))

    def show_job(self, job: Job) -> None:
        raise NotImplementedError
