"""Profiler: op-type totals of the latest profile job per target (one BarGraphItem)."""

from __future__ import annotations

from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from studio.core.errors import StudioError
from studio.core.profile import SOURCE_NOTES
from studio.services import ui_support
from studio.ui.models.rows import Row, RowsModel
from studio.ui.pages.base import Page
from studio.ui.widgets import EmptyState, SourceBadge, label

TOP_N = 16


class ProfilerPage(Page):
    title = "Profiler"
    subtitle = "Where one decode step spends its time, by op type."

    def __init__(self, ctl, parent=None):
        super().__init__(ctl, parent)
        import pyqtgraph as pg  # only when the page is first shown

        self.pg = pg
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(0, 6, 0, 0)
        self.empty = EmptyState(
            "No profile yet",
            "Run the profile stage to profile one decode step of the compiled model on the QNN "
            "HTP simulator: the time per op type appears here as bars, with a table. Simulator "
            "cycles follow the host CPU, so they show where the time goes, not device latency. "
            "HTP per-core timelines, DDR traffic, the roofline and run-vs-run diffs come in "
            "later releases.",
        )
        self.empty.add_action(
            "Run profile",
            self._run_profile,
            "Runs profile and what it needs (export, quantize, compile)",
        )
        lay.addWidget(self.empty)
        self.content = QWidget()
        cl = QVBoxLayout(self.content)
        cl.setContentsMargins(0, 0, 0, 0)
        head = QHBoxLayout()
        head.addWidget(label("Target:"))
        self.target = QComboBox()
        self.target.currentIndexChanged.connect(self._show)
        head.addWidget(self.target)
        self.job_label = label("", "muted")
        head.addWidget(self.job_label, 1)
        self.badge = SourceBadge("simulated")
        head.addWidget(self.badge)
        cl.addLayout(head)
        self.note = label("", "muted", wrap=True)
        cl.addWidget(self.note)
        split = QSplitter()
        self.plot = pg.PlotWidget()
        self.plot.setMenuEnabled(False)
        self.plot.showGrid(x=True, y=False, alpha=0.3)
        self.plot.getPlotItem().invertY(True)
        self.plot.setMouseEnabled(x=True, y=False)
        split.addWidget(self.plot)
        self.table = RowsModel(["Op type", "Total", "Share"], self)
        view = QTableView()
        view.setModel(self.table)
        view.verticalHeader().hide()
        view.setWordWrap(False)
        view.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        view.horizontalHeader().setStretchLastSection(True)
        split.addWidget(view)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 2)
        cl.addWidget(split, 1)
        lay.addWidget(self.content, 1)
        self._bars = None
        self._jobs: list = []
        ctl.job_event.connect(self._on_job)
        self._apply_theme()

    def _apply_theme(self) -> None:
        pal = self.palette()
        self.plot.setBackground(pal.base().color())
        fg = pal.text().color()
        for axis in ("left", "bottom"):
            ax = self.plot.getAxis(axis)
            ax.setTextPen(fg)
            ax.setPen(fg)

    def on_show(self) -> None:
        self.refresh()

    def on_open(self) -> None:
        self.refresh()

    def _on_job(self, job) -> None:
        if job.stage == "profile" and job.state == "succeeded":
            self.later(self.refresh)

    def _run_profile(self) -> None:
        try:
            self.ctl.run(["profile"])
        except StudioError as exc:
            self.ctl.message.emit("error", exc.message)

    def refresh(self) -> None:
        self._jobs = sorted(
            ui_support.latest_jobs(self.ctl.studio.jobs, "profile"), key=lambda j: j.target
        )
        has = bool(self._jobs)
        self.empty.setVisible(not has)
        self.content.setVisible(has)
        if not has:
            return
        current = self.target.currentData()
        self.target.blockSignals(True)
        self.target.clear()
        for j in self._jobs:
            self.target.addItem(j.target, j.id)
        self.target.setCurrentIndex(max(0, self.target.findData(current)))
        self.target.blockSignals(False)
        self._show()

    def _show(self, *_args) -> None:
        if self.ctl.studio is None or not self._jobs:
            return
        jid = self.target.currentData()
        job = next((j for j in self._jobs if j.id == jid), self._jobs[0])
        totals, unit, source = ui_support.profile_totals(self.ctl.studio, job)
        self.badge.set_source(source or "simulated", SOURCE_NOTES.get(source, ""))
        self.job_label.setText(f"job #{job.id} · {(job.result or {}).get('summary', job.message)}")
        self.note.setText(SOURCE_NOTES.get(source, ""))
        items = sorted(totals.items(), key=lambda kv: -kv[1])
        total = sum(v for _, v in items) or 1.0
        shown = items[:TOP_N]
        if len(items) > TOP_N:
            shown.append((f"{len(items) - TOP_N} other op types", sum(v for _, v in items[TOP_N:])))
        self.plot.clear()
        if shown:
            ys = list(range(len(shown)))
            color = "#8a5a00" if source == "simulated" else "#2f6fd6"
            self._bars = self.pg.BarGraphItem(
                x0=[0] * len(shown),
                y=ys,
                height=0.7,
                width=[v for _, v in shown],
                brush=color,
                pen=None,
            )
            self.plot.addItem(self._bars)
            self.plot.getAxis("left").setTicks([[(i, name) for i, (name, _) in enumerate(shown)]])
            self.plot.setLabel("bottom", f"{unit} ({source})")
            self.plot.setYRange(-0.6, len(shown) - 0.4, padding=0)
            self.plot.setXRange(0, max(v for _, v in shown) * 1.05, padding=0)
        self.table.set_rows(
            [
                Row([name, f"{v:,.0f} {unit}", f"{v / total:.1%}"], align_right=(1, 2))
                for name, v in items
            ]
        )


def main() -> int:
    from studio.ui.standalone import run_page

    return run_page(ProfilerPage)


if __name__ == "__main__":
    raise SystemExit(main())
