"""Reports: the HTML reports of the project folder; open them in the browser."""

from __future__ import annotations

import time

from PySide6.QtCore import QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QTableView,
)

from studio.core.units import format_bytes
from studio.services import projects
from studio.ui.models.rows import PayloadRole, Row, RowsModel
from studio.ui.pages.base import StagePage
from studio.ui.widgets import label


class ReportsPage(StagePage):
    title = "Reports"
    subtitle = (
        "Self-contained HTML reports (plots inside) written by the report stage, with JSON for CI."
    )

    stage = "report"
    refresh_ms = 400

    def __init__(self, ctl, parent=None):
        super().__init__(
            ctl,
            "No reports yet",
            "Run the pipeline: its last stage, report, writes a self-contained HTML report "
            "(every figure with its source) and a JSON file for CI into the project's reports "
            "folder, and they are listed here. <code>studio --batch</code> writes the same "
            "reports.",
            parent,
        )
        self.empty.add_action(
            "Run pipeline",
            lambda: self.run_stages(None),
            "Run every stage of the project, then the report",
        )
        self.empty.add_action(
            "Run report only", self.run_stage, "A report of whatever the project has now"
        )
        cl = self.content_layout
        bar = QHBoxLayout()
        self.open_button = QPushButton("Open report")
        self.open_button.clicked.connect(self.open_selected)
        bar.addWidget(self.open_button)
        self.json_button = QPushButton("Open JSON")
        self.json_button.clicked.connect(lambda: self.open_selected(json=True))
        bar.addWidget(self.json_button)
        self.folder_button = QPushButton("Open folder")
        self.folder_button.clicked.connect(self.open_folder)
        bar.addWidget(self.folder_button)
        bar.addStretch(1)
        self.folder_label = label("", "muted", selectable=True)
        bar.addWidget(self.folder_label)
        cl.addLayout(bar)
        self.model = RowsModel(["Report", "Written", "Size"], self)
        self.view = QTableView()
        self.view.setModel(self.model)
        self.view.verticalHeader().hide()
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        header = self.view.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for col in (1, 2):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        self.view.doubleClicked.connect(lambda _i: self.open_selected())
        self.view.selectionModel().selectionChanged.connect(self._update_buttons)
        cl.addWidget(self.view, 1)
        cl.addWidget(label("Double-click a report to open it in your browser.", "muted"))
        self.opened_urls: list[str] = []  # what was handed to the desktop (for tests)

    def refresh(self) -> None:
        """Lists the report files (not jobs): ``studio --batch`` writes them too."""
        files = projects.report_files(self.ctl.project)
        self.set_has_content(bool(files))
        self.folder_label.setText(str(self.ctl.project.folder / "reports"))
        rows = []
        for f in files:
            st = f.stat()
            name = f.name + ("  (latest)" if f.name == "latest.html" else "")
            rows.append(
                Row(
                    [
                        name,
                        time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st.st_mtime)),
                        format_bytes(st.st_size),
                    ],
                    payload=f,
                    tip=str(f),
                    align_right=(2,),
                )
            )
        self.model.set_rows(rows)
        if files and not self.view.selectionModel().hasSelection():
            self.view.selectRow(0)
        self._update_buttons()

    def selected(self):
        rows = self.view.selectionModel().selectedRows()
        return rows[0].data(PayloadRole) if rows else None

    def _update_buttons(self, *_args) -> None:
        f = self.selected()
        self.open_button.setEnabled(f is not None)
        self.json_button.setEnabled(f is not None and f.with_suffix(".json").exists())
        self.json_button.setToolTip("The report's data as JSON (what CI reads)")

    def _open(self, path) -> bool:
        url = QUrl.fromLocalFile(str(path))
        self.opened_urls.append(url.toString())
        ok = QDesktopServices.openUrl(url)
        if not ok:
            self.ctl.message.emit("error", f"no application could open {path}")
        return ok

    def open_selected(self, json: bool = False) -> bool:
        f = self.selected()
        if f is None:
            return False
        return self._open(f.with_suffix(".json") if json else f)

    def open_folder(self) -> bool:
        return self._open(self.ctl.project.folder / "reports")


def main() -> int:
    from studio.ui.standalone import run_page

    return run_page(ReportsPage)


if __name__ == "__main__":
    raise SystemExit(main())
