"""Reports: the HTML reports of the project folder, read in the window (charts included) or
opened in the browser; the JSON beside each shown as text. Export the
report of a run (the newest by default, any run of the history) as HTML, Markdown, PDF or
JSON: the report is assembled off the UI thread, the PDF printed with Qt."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QSplitter,
    QTableView,
)

from studio.core.errors import StudioError
from studio.core.units import format_bytes
from studio.services import history, projects, reports
from studio.ui.models.rows import PayloadRole, Row, RowsModel
from studio.ui.pages.base import StagePage
from studio.ui.printing import print_pdf
from studio.ui.report_view import ReportView
from studio.ui.standalone import run_page
from studio.ui.widgets import label

#: what the export offers (format -> its name in the menu)
EXPORT_FORMATS = {"html": "HTML page", "md": "Markdown", "pdf": "PDF", "json": "JSON"}


class ReportsPage(StagePage):
    key = "reports"

    role = "report"
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
        self.open_button = QPushButton("Open in browser")
        self.open_button.setToolTip("The selected report in your web browser (it is read "
                                    "below without one)")
        self.open_button.clicked.connect(self.open_selected)
        bar.addWidget(self.open_button)
        self.json_button = QPushButton("Show JSON")
        self.json_button.clicked.connect(self.show_json)
        bar.addWidget(self.json_button)
        self.folder_button = QPushButton("Open folder")
        self.folder_button.clicked.connect(self.open_folder)
        bar.addWidget(self.folder_button)
        bar.addStretch(1)
        self.folder_label = label("", "muted", selectable=True)
        bar.addWidget(self.folder_label)
        cl.addLayout(bar)
        export = QHBoxLayout()
        export.addWidget(label("Export the report of", "muted"))
        self.run_combo = QComboBox()
        self.run_combo.setToolTip("Any run of the history with results (newest first)")
        export.addWidget(self.run_combo)
        export.addWidget(label("as", "muted"))
        self.format_combo = QComboBox()
        for fmt, title in EXPORT_FORMATS.items():
            self.format_combo.addItem(title, fmt)
        export.addWidget(self.format_combo)
        self.export_button = QPushButton("Export…")
        self.export_button.setToolTip("Write the run's report to a file you choose")
        self.export_button.clicked.connect(self.choose_and_export)
        export.addWidget(self.export_button)
        self.export_status = label("", "muted", selectable=True)
        export.addWidget(self.export_status, 1)
        cl.addLayout(export)
        self._export_task: asyncio.Task | None = None
        self.exported: list[Path] = []  # what was written (for tests)
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
        self.view.selectionModel().selectionChanged.connect(self._show_selected)
        self.reader = ReportView()
        split = QSplitter(Qt.Orientation.Vertical)
        split.addWidget(self.view)
        split.addWidget(self.reader)
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 4)
        cl.addWidget(split, 1)
        cl.addWidget(label("The selected report is read here, its charts included; "
                           "double-click one to open it in your browser.", "muted"))
        self.opened_urls: list[str] = []  # what was handed to the desktop (for tests)

    def refresh(self) -> None:
        """Lists the report files (not jobs): ``studio --batch`` writes them too."""
        files = projects.report_files(self.ctl.project)
        runs = history.runs_with_results(self.ctl.studio.jobs)
        self.set_has_content(bool(files) or bool(runs))
        self._fill_runs(runs)
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

    def _fill_runs(self, runs: list[int]) -> None:
        have = [self.run_combo.itemData(i) for i in range(self.run_combo.count())]
        if have == runs:
            return
        keep = self.run_combo.currentData()
        self.run_combo.blockSignals(True)
        self.run_combo.clear()
        for i, run in enumerate(runs):
            info = history.run_info(self.ctl.project, self.ctl.studio.jobs, run)
            when = time.strftime("%Y-%m-%d %H:%M", time.localtime(info.created)) if info else ""
            self.run_combo.addItem(f"run {run}" + (" (newest)" if i == 0 else "")
                                   + (f", {when}" if when else ""), run)
        if keep in runs and keep != (have[0] if have else None):
            self.run_combo.setCurrentIndex(runs.index(keep))
        self.run_combo.blockSignals(False)
        self.export_button.setEnabled(bool(runs))

    def choose_and_export(self) -> None:
        """Ask where to write the chosen run's report, then export it."""
        run, fmt = self.run_combo.currentData(), self.format_combo.currentData()
        if run is None:
            return
        default = reports.default_out(self.ctl.project, run, fmt)
        path, _ = QFileDialog.getSaveFileName(
            self, f"Export the report of run {run}", str(default),
            f"{EXPORT_FORMATS[fmt]} (*{reports.SUFFIX[fmt]})")
        if path:
            self.export_report(fmt, Path(path), run)

    def export_report(self, fmt: str, out: Path, run: int | None = None) -> asyncio.Task:
        """Write run ``run``'s report (default: the newest run with results) as ``fmt`` into
        ``out``: the history and artifacts are read in a thread, the PDF printed here."""
        studio = self.ctl.studio
        project = studio.project.copy()
        self.export_button.setEnabled(False)
        self.export_status.setText(f"Writing the {fmt} report…")

        def build() -> dict:
            return reports.report_data(project, studio.jobs, studio.store, run)

        async def go() -> None:
            try:
                data = await self.ctl.in_thread(build)
                # Qt's rich text, SVG and PDF writer are reentrant: the PDF prints in the
                # thread too (the application and its fonts exist already)
                written = await self.ctl.in_thread(reports.write, data, fmt, out,
                                                   print_pdf if fmt == "pdf" else None)
            except StudioError as exc:
                self.export_status.setText(exc.message)
                self.ctl.message.emit("error", exc.message)
            else:
                self.exported.append(written)
                self.export_status.setText(f"Wrote {written}")
                if written.parent == self.ctl.project.folder / "reports":
                    self.refresh()
            finally:
                self.export_button.setEnabled(self.run_combo.count() > 0)

        self._export_task = asyncio.ensure_future(go())
        return self._export_task

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

    def _show_selected(self, *_args) -> None:
        f = self.selected()
        if f is not None and f.is_file():
            self.reader.show_file(f)

    def show_json(self) -> None:
        """The selected report's JSON (what CI reads) in the reader."""
        f = self.selected()
        if f is not None and f.with_suffix(".json").is_file():
            self.reader.show_file(f.with_suffix(".json"))

    def open_selected(self, json: bool = False) -> bool:
        f = self.selected()
        if f is None:
            return False
        return self._open(f.with_suffix(".json") if json else f)

    def open_folder(self) -> bool:
        return self._open(self.ctl.project.folder / "reports")


def main() -> int:
    return run_page(ReportsPage)


if __name__ == "__main__":
    raise SystemExit(main())
