"""What every page shares: the controller, a header, the no-project state, and a way to open
the page alone with sample data (``python -m studio.ui.pages.<name>``).

``StagePage`` is a page that shows the latest jobs of one stage (an empty state until there
are some); ``TargetStagePage`` adds a target picker that shows one of those jobs at a time."""

from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QFrame,
    QHBoxLayout,
    QStackedWidget,
    QVBoxLayout,
    QWidget,
)

from studio.core.errors import StudioError
from studio.core.jobs import Job
from studio.services import history
from studio.ui.controller import ProjectController
from studio.ui.widgets import EmptyState, SourceBadge, label


def banner(text: str) -> QFrame:
    """A framed note (rich text) about what a page will show in a later release."""
    frame = QFrame()
    frame.setProperty("role", "banner")
    QVBoxLayout(frame).addWidget(label(text, wrap=True))
    return frame


class Page(QWidget):
    #: the name in the navigation
    title = "Page"
    #: one line under the title
    subtitle = ""
    #: ask the window to show another page (by title)
    navigate = Signal(str)

    def __init__(self, ctl: ProjectController, parent: QWidget | None = None):
        super().__init__(parent)
        self.ctl = ctl
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

    # ---- lifecycle --------------------------------------------------------------------------
    def _on_opened(self) -> None:
        self.stack.setCurrentWidget(self.body)
        self.on_open()

    def _on_closed(self) -> None:
        self.stack.setCurrentWidget(self.no_project)
        self.on_close()

    def _on_changed(self, change) -> None:
        if self.ctl.studio is not None:
            self.on_change(change)

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

    # ---- for subclasses ---------------------------------------------------------------------
    def on_show(self) -> None:
        """The page became visible: re-read what another process (studio --batch) may have
        added to the run history."""

    def on_open(self) -> None:
        pass

    def on_close(self) -> None:
        pass

    def on_change(self, change) -> None:
        pass


class StagePage(Page):
    """A page about one stage: ``empty`` (an EmptyState) until the run history holds a
    succeeded job of the stage, then ``content``. Subclasses set ``stage``, fill
    ``content_layout`` and draw the jobs in ``show_jobs``."""

    #: the stage whose latest succeeded jobs the page shows
    stage = ""
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
        self._jobs: list[Job] = []
        ctl.job_event.connect(self._on_job)

    def on_show(self) -> None:
        self.refresh()

    def on_open(self) -> None:
        self.refresh()

    def _on_job(self, job: Job) -> None:
        if job.stage == self.stage and job.state == "succeeded":
            self.later(self.refresh, self.refresh_ms)

    def run_stage(self) -> None:
        """Run the page's stage (and what it needs)."""
        self.run_stages([self.stage])

    def set_has_content(self, has: bool) -> bool:
        """Show ``content`` if ``has``, else the empty state; returns ``has``."""
        self.empty.setVisible(not has)
        self.content.setVisible(has)
        return has

    def sort_key(self, job: Job):
        """The order of the jobs (one per target)."""
        return job.target

    def refresh(self) -> None:
        jobs = history.latest_jobs(self.ctl.studio.jobs, self.stage)
        self._jobs = sorted(jobs, key=self.sort_key)
        if self.set_has_content(bool(self._jobs)):
            self.show_jobs(self._jobs)

    def show_jobs(self, jobs: list[Job]) -> None:
        """Draw ``jobs`` (never empty)."""
        raise NotImplementedError


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
