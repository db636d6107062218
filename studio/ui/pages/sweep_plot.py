"""The Sweeps page's chart (:mod:`studio.ui.pages.sweeps`): accuracy against size for every
point with both, the Pareto front joined, the best point ringed, the selected one marked;
a click on a point emits its row (``clicked``)."""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QVBoxLayout, QWidget

from studio.core.lazyimport import lazy_module
from studio.services.sweep_report import fmt_bytes
from studio.ui.widgets import label, plot_axes, plot_message

pg = lazy_module("pyqtgraph")

FRONT_COLOR = "#d9480f"  # the Pareto front (as in the sweep's HTML report)
OTHER_COLOR = "#868e96"
BEST_COLOR = "#2b8a3e"


class SweepPlot(QWidget):
    """Accuracy against size, the Pareto front and the best point."""

    clicked = Signal(int)  # the row of the point clicked

    def __init__(self, parent=None):
        super().__init__(parent)

        self.pg = pg
        self.rows: list[dict[str, Any]] = []
        self.selection_ring = None
        self._labels: list[Any] = []
        pl = QVBoxLayout(self)
        pl.setContentsMargins(0, 4, 0, 0)
        pl.setSpacing(2)
        self.legend = label("", wrap=True)
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        self.legend.setText(
            f'<span style="color:{FRONT_COLOR}">●</span> every gate passed &nbsp; '
            f'<span style="color:{FRONT_COLOR}">○</span> a gate failed &nbsp; '
            f'<span style="color:{FRONT_COLOR}">orange, joined</span>: the Pareto front '
            f'&nbsp; <span style="color:{OTHER_COLOR}">grey</span>: off the front &nbsp; '
            f'<span style="color:{BEST_COLOR}">◎</span> the best point &nbsp; · &nbsp;click a '
            "point to select it")
        self.legend.setToolTip("The Pareto front: the points no other point beats on both "
                               "accuracy and size. The best point follows the sweep's rule, "
                               "among the points that pass every gate.")
        pl.addWidget(self.legend)
        self.plot = pg.PlotWidget()
        self.plot.setMenuEnabled(False)
        self.plot.showGrid(x=True, y=True, alpha=0.25)
        self.plot.getPlotItem().hideButtons()
        self.plot.setMinimumHeight(200)
        for axis in ("left", "bottom"):
            self.plot.getAxis(axis).enableAutoSIPrefix(False)
        self.scatter = pg.ScatterPlotItem(hoverable=True, tip=self._tip)
        self.scatter.sigClicked.connect(self._clicked)
        pl.addWidget(self.plot, 1)

    def _clicked(self, _item, points, _ev=None) -> None:
        if len(points):
            i = points[0].data()
            if isinstance(i, int) and i < len(self.rows):
                self.clicked.emit(i)

    def ring(self, row: int | None) -> None:
        """Mark the point of ``row`` as selected (none: no mark)."""
        ring = self.selection_ring
        if ring is None or ring.scene() is None:
            return
        if row is not None and row in self.plotted():
            r = self.rows[row]
            ring.setData([r["size_bytes"] / 2**20], [r["accuracy"]])
        else:
            ring.setData([], [])

    def plotted(self) -> list[int]:
        return [i for i, r in enumerate(self.rows)
                if r["accuracy"] is not None and r["size_bytes"] is not None]

    def draw(self, rows: list[dict[str, Any]], accuracy_axis: str, size_axis: str,
             running: bool) -> None:
        """The sweep's points (the page's rows): accuracy (``accuracy_axis``, its title and
        source) against size (``size_axis``), the front, the best point and each label;
        ``running``: the message of an empty plot says the points come as they finish."""
        pg = self.pg
        self.rows = rows
        plot = self.plot
        plot.clear()
        self.scatter.clear()
        self._labels: list[Any] = []
        # two lines: on one, the title ran past the short axis of a 1280 × 800 window
        self.plot.setLabel("left", accuracy_axis)
        self.plot.setLabel("bottom", size_axis)
        idx = self.plotted()
        if not idx:  # says why, no bare 0-1 axes
            plot_message(plot, "No point has both an accuracy and a size yet"
                         + (": they appear as points finish" if running
                            else ": run the sweep"))
            return
        plot_axes(plot)
        xs = {i: self.rows[i]["size_bytes"] / 2**20 for i in idx}
        ys = {i: self.rows[i]["accuracy"] for i in idx}
        front = sorted((i for i in idx if self.rows[i]["front"]), key=lambda i: xs[i])
        if len(front) > 1:
            plot.addItem(pg.PlotDataItem(
                [xs[i] for i in front], [ys[i] for i in front],
                pen=pg.mkPen(FRONT_COLOR, width=1.5, style=Qt.PenStyle.DashLine)))
        spots = []
        for i in idx:
            r = self.rows[i]
            color = FRONT_COLOR if r["front"] else OTHER_COLOR
            passed = r["state"] == "succeeded" and bool(r["point"].get("gates_passed"))
            spots.append({"pos": (xs[i], ys[i]), "data": i, "size": 12, "symbol": "o",
                          "pen": pg.mkPen(color, width=2),
                          "brush": pg.mkBrush(color) if passed else pg.mkBrush(0, 0, 0, 0)})
        self.scatter.setData(spots)
        plot.addItem(self.scatter)
        best = [i for i in idx if self.rows[i]["best"]]
        if best:
            plot.addItem(pg.ScatterPlotItem(
                [xs[best[0]]], [ys[best[0]]], size=26, symbol="o",
                pen=pg.mkPen(BEST_COLOR, width=2.5), brush=pg.mkBrush(0, 0, 0, 0)))
        self.selection_ring = pg.ScatterPlotItem(
            size=34, symbol="s", pen=pg.mkPen(self.palette().highlight().color(), width=2,
                                              style=Qt.PenStyle.DotLine),
            brush=pg.mkBrush(0, 0, 0, 0))
        plot.addItem(self.selection_ring)
        fg = self.palette().text().color()
        for i in idx:
            t = pg.TextItem(self.rows[i]["label"], color=fg, anchor=(-0.9, 1.0))
            t.setPos(xs[i], ys[i])
            plot.addItem(t)
            self._labels.append(t)
        x0, x1 = min(xs.values()), max(xs.values())
        y0, y1 = min(ys.values()), max(ys.values())
        if x1 - x0 < 1e-9:
            x0, x1 = x0 * 0.9, x1 * 1.1 + 1e-6
        if y1 - y0 < 1e-12:
            y0, y1 = y0 - 1e-4, y1 + 1e-4
        xm, ym = (x1 - x0) * 0.12, (y1 - y0) * 0.18
        plot.setXRange(x0 - xm, x1 + xm, padding=0)
        plot.setYRange(y0 - ym, y1 + ym, padding=0)

    def _tip(self, x: float, y: float, data: Any) -> str:
        if not isinstance(data, int) or data >= len(self.rows):
            return ""
        r = self.rows[data]
        return (f"{r['label']}: {r['settings']}\n{r['state']}"
                + (f" — {r['reason']}" if r["reason"] else "")
                + f"\naccuracy {r['accuracy']:.6f} ({r['accuracy_source']})"
                + f"\n{r['size_title'] or 'size'} {fmt_bytes(r['size_bytes'])} "
                  f"({r['size_source']})"
                + f"\nweights {fmt_bytes(r['weight_bytes'])} ({r['weight_source']})")
