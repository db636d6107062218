"""What every page shares: the controller, a header, the no-project state, and a way to open
the page alone with sample data (``python -m studio.ui.pages.<name>``)."""

from __future__ import annotations

from PySide6.QtCore import QTimer, Signal
from PySide6.QtWidgets import QHBoxLayout, QStackedWidget, QVBoxLayout, QWidget

from studio.ui.controller import ProjectController
from studio.ui.widgets import EmptyState, label


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
