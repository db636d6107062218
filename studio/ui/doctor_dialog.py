"""Help → Doctor: ``studio doctor`` in the window — this machine, the open project and a
device checked, each check PASS / WARN / FAIL with its fix, run off the UI thread."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QBrush, QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
)

from studio.services.doctor import Check, device_choices, doctor, verdict
from studio.ui.loading import LatestLoad
from studio.ui.widgets import label

STATUS_COLOURS = {"PASS": "#1b8a3f", "WARN": "#9a6700", "FAIL": "#c62828", "SKIP": "#6b7280"}
COLUMNS = ("Status", "Area", "Check", "Finding", "Fix")


def run_checks(project_file: Path | None, device_id: str | None) -> list[dict[str, Any]]:
    return [c.to_dict() for c in doctor(project_file, device_id or None)]


class DoctorDialog(QDialog):
    def __init__(self, ctl, parent=None) -> None:
        super().__init__(parent)
        self.ctl = ctl
        self.setWindowTitle("Doctor")
        self.resize(1100, 560)
        project = ctl.project
        self.project_file = project.path if project is not None else None
        lay = QVBoxLayout(self)
        lay.addWidget(label(
            "Checks this machine" + (f", the project <b>{project.name}</b>" if project else "")
            + " and, if you pick one, a device — before the work, not after it. Each "
            "finding comes with its fix; the same checks run headless as "
            "<code>studio doctor FILE --device D</code>.", wrap=True))
        row = QHBoxLayout()
        row.addWidget(label("Device:"))
        self.device = QComboBox()
        self.device.addItem("none (this machine and the project)", "")
        row.addWidget(self.device, 1)
        self.check_btn = QPushButton("Run checks")
        self.check_btn.clicked.connect(self.run)
        row.addWidget(self.check_btn)
        lay.addLayout(row)
        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setWordWrap(True)
        self.table.verticalHeader().hide()
        h = self.table.horizontalHeader()
        for i in range(3):
            h.setSectionResizeMode(i, QHeaderView.ResizeMode.ResizeToContents)
        h.setSectionResizeMode(3, QHeaderView.ResizeMode.Stretch)
        h.setSectionResizeMode(4, QHeaderView.ResizeMode.Stretch)
        lay.addWidget(self.table, 1)
        self.verdict = label("Checking…")
        lay.addWidget(self.verdict)
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        buttons.rejected.connect(self.reject)
        lay.addWidget(buttons)
        self.checks: list[dict[str, Any]] = []
        self._load = LatestLoad(ctl)
        self._devices = LatestLoad(ctl)

        self._devices.start(device_choices, done=self._fill_devices, failed=lambda e: None)
        self.run()

    def _fill_devices(self, choices: list[tuple[str, str]]) -> None:
        for text, dev in choices:
            self.device.addItem(text, dev)

    def run(self) -> None:
        self.check_btn.setEnabled(False)
        self.check_btn.setText("Checking…")
        self.verdict.setText("Checking…" + (f" (the device {self.device.currentData()} may take "
                                            "a few seconds)" if self.device.currentData() else ""))
        self._load.start(run_checks, self.project_file, self.device.currentData(),
                         done=self.show_checks, failed=self._failed)

    def _failed(self, exc: Exception) -> None:
        self.check_btn.setEnabled(True)
        self.check_btn.setText("Run checks")
        self.verdict.setText(f"The checks could not run: {exc}")

    def show_checks(self, checks: list[dict[str, Any]]) -> None:
        self.checks = checks
        # what fails first, then what warns, each in the order it was checked
        shown = sorted(checks, key=lambda c: {"FAIL": 0, "WARN": 1}.get(c["status"], 2))
        self.table.setRowCount(len(shown))
        for r, c in enumerate(shown):
            cells = (c["status"], c["area"], c["name"], c["detail"],
                     c["fix"] if c["status"] != "PASS" else "")
            for col, text in enumerate(cells):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                if col == 0:
                    item.setForeground(QBrush(QColor(STATUS_COLOURS.get(text, "#000000"))))
                    item.setTextAlignment(Qt.AlignmentFlag.AlignCenter)
                self.table.setItem(r, col, item)
        self.table.resizeRowsToContents()
        self.verdict.setText(verdict([Check(**c) for c in checks]))
        self.check_btn.setEnabled(True)
        self.check_btn.setText("Run checks")
