"""The window's welcome screen, shown while no project is open: new project, open one, and
the recent projects."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QHBoxLayout,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from studio.ui.widgets import label


class MainWindow(Protocol):
    """What the welcome screen asks of the window (:class:`studio.ui.main_window.MainWindow`):
    the app's settings (its recent projects), a notification, opening a project, a new one
    and the open dialog."""

    settings: Any

    def notify(self, text: str, level: str = "info", timeout_ms: int = 0) -> Any: ...

    def open_project(self, path: Path) -> bool: ...

    def new_project(self) -> Any: ...

    def open_dialog(self) -> None: ...


class Welcome(QWidget):
    """Shown on the Overview page while no project is open: new, open, recent."""

    def __init__(self, window: MainWindow):
        super().__init__()
        self.window_ = window
        lay = QVBoxLayout(self)
        lay.setContentsMargins(40, 30, 40, 30)
        lay.addWidget(label("Welcome to QStudio", "title"))
        lay.addWidget(
            label(
                "Take a language model from a PyTorch / Hugging Face checkpoint to a Snapdragon "
                "NPU: export, quantize, compile, validate, run and profile — every figure labelled "
                "with where it comes from.",
                "subtitle",
                wrap=True,
            )
        )
        lay.addSpacing(14)
        row = QHBoxLayout()
        new = QPushButton("New project…")
        new.setDefault(True)
        new.setToolTip("From the sample model, a checkpoint folder or an ONNX file (Ctrl+N)")
        new.clicked.connect(window.new_project)
        row.addWidget(new)
        open_ = QPushButton("Open…")
        open_.setToolTip("Open a .qstudio project file (Ctrl+O)")
        open_.clicked.connect(window.open_dialog)
        row.addWidget(open_)
        row.addStretch(1)
        lay.addLayout(row)
        lay.addSpacing(18)
        lay.addWidget(label("<b>Recent projects</b>"))
        self.recent = QListWidget()
        self.recent.itemActivated.connect(self._activated)
        self.recent.itemClicked.connect(self._activated)
        self.recent.setMaximumWidth(900)
        lay.addWidget(self.recent, 1)
        self.none = label(
            "No recent projects yet: create one from the sample model to look "
            "around (it exports and quantizes in about a minute).",
            "muted",
            wrap=True,
        )
        lay.addWidget(self.none)
        self.filler = QWidget()
        lay.addWidget(self.filler, 1)

    def refresh(self) -> None:
        self.recent.clear()
        items = self.window_.settings.recent_projects()
        for p in items:
            item = QListWidgetItem(f"{p.stem}    —    {p}")
            item.setData(Qt.ItemDataRole.UserRole, str(p))
            if not p.exists():
                item.setText(f"{p.stem}    —    {p}   (missing)")
                item.setForeground(Qt.GlobalColor.gray)
                item.setToolTip("The file is not there any more; click to remove it from the list")
            self.recent.addItem(item)
        self.none.setVisible(not items)
        self.recent.setVisible(bool(items))
        self.filler.setVisible(not items)

    def _activated(self, item: QListWidgetItem) -> None:
        path = Path(item.data(Qt.ItemDataRole.UserRole))
        if not path.exists():
            self.window_.settings.remove_recent(path)
            self.window_.notify(f"{path} does not exist any more; removed from recent projects")
            self.refresh()
            return
        self.window_.open_project(path)
