"""Profiler: op-type totals of the latest profile job per target (one BarGraphItem)."""

from __future__ import annotations

from PySide6.QtWidgets import QHeaderView, QSplitter, QTableView

from studio.core.profile import SOURCE_NOTES
from studio.services import history
from studio.ui.models.rows import Row, RowsModel
from studio.ui.pages.base import TargetStagePage
from studio.ui.widgets import label, theme_plot

TOP_N = 16


class ProfilerPage(TargetStagePage):
    title = "Profiler"
    subtitle = "Where one decode step spends its time, by op type."

    stage = "profile"

    def __init__(self, ctl, parent=None):
        super().__init__(
            ctl,
            "No profile yet",
            "Run the profile stage to profile one decode step of the compiled model on the QNN "
            "HTP simulator: the time per op type appears here as bars, with a table. Simulator "
            "cycles follow the host CPU, so they show where the time goes, not device latency. "
            "HTP per-core timelines, DDR traffic, the roofline and run-vs-run diffs come in "
            "later releases.",
            parent,
        )
        import pyqtgraph as pg  # only when the page is first shown

        self.pg = pg
        self.empty.add_action(
            "Run profile",
            self.run_stage,
            "Runs profile and what it needs (export, quantize, compile)",
        )
        cl = self.content_layout
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
        self._bars = None
        self._apply_theme()

    def _apply_theme(self) -> None:
        theme_plot(self.plot, self.palette())

    def show_job(self, job) -> None:
        totals, unit, source = history.profile_totals(self.ctl.studio, job)
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
