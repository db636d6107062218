"""The Profiler's "DDR & roofline" tab: the quantized graph's DRAM bytes per token per
layer and every layer (and op) placed on the roofline of a chosen catalog chip.

All figures here are the performance model's (``estimated``): analytic MACs and bytes from
the ONNX graph (weights at their stored precision), the chip's DDR bandwidth and peak ops
from the catalog, and the efficiencies fitted on published device numbers.
"""

from __future__ import annotations

import math

import numpy as np
from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QSplitter,
    QTableView,
    QVBoxLayout,
    QWidget,
)

from studio.core.catalog import load_catalog
from studio.core.errors import StudioError
from studio.core.units import format_bytes
from studio.services.estimate import graph_roofline
from studio.services.memory import stage_graphs
from studio.ui.loading import LatestLoad
from studio.ui.models.rows import Row, RowsModel
from studio.ui.widgets import label, plot_axes, plot_message, theme_plot

#: the bars' unit: MiB, as every byte figure of the studio is written
MIB = 2**20

LAYER_COLORS = ("#2f6fd6", "#1f8a4c", "#8a5a00", "#6a4fb3", "#d64545", "#0f8a8a")


def _si(v: float, unit: str) -> str:
    for factor, prefix in ((1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(v) >= factor:
            return f"{v / factor:.3g} {prefix}{unit}"
    return f"{v:.3g} {unit}"


class RooflineTab(QWidget):
    loaded = Signal()

    def __init__(self, ctl, pg, parent=None):
        super().__init__(parent)
        self.ctl, self.pg = ctl, pg
        self.result: dict | None = None
        self.graphs: dict = {}  # {stage: {graph: path}} of the shown profile, or {}
        # DRAM bytes per layer from the compiler (optrace) for the shown profile, if any
        self.compiler_bytes: dict = {}
        self._load = LatestLoad(ctl)
        lay = QVBoxLayout(self)
        row = QHBoxLayout()
        row.addWidget(label("Chip:"))
        self.chip = QComboBox()
        self.chip.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        for chip in load_catalog().values():
            unknown = chip.perf_unknown()
            self.chip.addItem(chip.label + (" — figures unknown" if unknown else ""), chip.key)
        self.chip.currentIndexChanged.connect(self.load)
        row.addWidget(self.chip)
        row.addWidget(label("Graph:"))
        self.graph = QComboBox()
        self.graph.addItem("decode step (quantized)", "decode")
        self.graph.addItem("prefill (quantized)", "prefill")
        self.graph.currentIndexChanged.connect(self.load)
        row.addWidget(self.graph)
        self.status = label("", "muted", wrap=True)
        row.addWidget(self.status, 1)
        lay.addLayout(row)
        split = QSplitter()
        self.roof = pg.PlotWidget()
        self.roof.setMenuEnabled(False)
        self.roof.setLogMode(x=True, y=True)
        self.roof.getAxis("left").enableAutoSIPrefix(False)
        self.roof.showGrid(x=True, y=True, alpha=0.25)
        self.roof.addLegend(offset=(10, 10))
        split.addWidget(self.roof)
        right = QSplitter(Qt.Orientation.Vertical)
        self.bytes_plot = pg.PlotWidget()
        self.bytes_plot.setMenuEnabled(False)
        self.bytes_plot.setMouseEnabled(x=False, y=False)
        right.addWidget(self.bytes_plot)
        self.table = RowsModel(["Layer", "MACs", "DRAM bytes", "Ops/byte", "Est. time", "Bound"],
                               self)
        view = QTableView()
        view.setModel(self.table)
        view.verticalHeader().hide()
        view.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        view.horizontalHeader().setStretchLastSection(True)
        right.addWidget(view)
        split.addWidget(right)
        split.setSizes([620, 520])
        lay.addWidget(split, 1)
        self.note = label("", "muted", wrap=True)
        lay.addWidget(self.note)
        self.apply_theme()
        for plot in (self.roof, self.bytes_plot):
            plot_message(plot, "No estimate yet: it is made when this tab is shown")

    def apply_theme(self) -> None:
        theme_plot(self.roof, self.palette())
        theme_plot(self.bytes_plot, self.palette())

    def select_chip(self, key: str) -> None:
        idx = self.chip.findData(key)
        if idx >= 0 and idx != self.chip.currentIndex():
            self.chip.blockSignals(True)
            self.chip.setCurrentIndex(idx)
            self.chip.blockSignals(False)

    # ---- loading (off the UI thread) ---------------------------------------------------------
    def load(self, *_args) -> None:
        studio = self.ctl.studio
        if studio is None:
            return
        project = studio.project.copy()
        chip, graph = self.chip.currentData(), self.graph.currentData()
        given = dict(self.graphs.get("quantize") or {})
        self.status.setText("Estimating…")
        for plot in (self.roof, self.bytes_plot):
            plot_message(plot, "Estimating…")

        def work() -> dict:
            graphs = given or stage_graphs(project, "quantize")
            if not graphs or graph not in graphs:
                raise StudioError("no quantized graph for the current settings: run the "
                                  "quantize stage (or the profile stage) first")
            return graph_roofline(graphs[graph], chip)

        def done(got: dict) -> None:
            self.show_result(got)
            self.loaded.emit()

        def failed(exc: Exception) -> None:
            self.result = None
            self.status.setText(exc.message if isinstance(exc, StudioError)
                                else f"the estimate failed: {exc!r}")
            why = ("No estimate: " + exc.message if isinstance(exc, StudioError)
                   else "The estimate failed (see the line above)")
            for plot in (self.roof, self.bytes_plot):
                plot_message(plot, why)
            self.table.set_rows([])
            self.loaded.emit()

        self._load.start(work, done=done, failed=failed)

    def show_result(self, res: dict) -> None:
        self.result = res
        self.status.setText(
            f"estimated decode-step time {res['total_s'] * 1e3:.2f} ms ({res['bound']}-bound) · "
            f"model {res['model_version']}")
        pg = self.pg
        fg = self.palette().text().color()
        peak, bw, ridge = res["peak_ops_per_s"], res["bytes_per_s"], res["ridge_ops_per_byte"]
        # the roof: bandwidth slope up to the ridge, then the compute ceiling (log-log axes)
        self.roof.clear()
        plot_axes(self.roof)
        xs = [1e-2, ridge, max(ridge * 100, 1e4)]
        ys = [bw * xs[0], peak, peak]
        self.roof.plot(xs, ys, pen=pg.mkPen(fg, width=2), name="roof (achievable)")
        ops = [p for p in res["points"] if p["macs"] > 0 and p["intensity"]]
        if ops:
            self.roof.plot([p["intensity"] for p in ops],
                           [max(p["attained_ops_per_s"], 1.0) for p in ops], pen=None,
                           symbol="o", symbolSize=5, symbolBrush=(120, 120, 120, 110),
                           symbolPen=None, name="ops")
        layers = [r for r in res["layers"] if r["intensity"]]
        for i, r in enumerate(layers):
            name = "outside layers" if r["layer"] is None else f"layer {r['layer']}"
            self.roof.plot([r["intensity"]], [max(r["attained_ops_per_s"], 1.0)], pen=None,
                           symbol="s", symbolSize=11,
                           symbolBrush=LAYER_COLORS[i % len(LAYER_COLORS)], name=name)
        self.roof.setLabel("bottom", "arithmetic intensity (ops per DRAM byte, log)")
        self.roof.setLabel("left", "attained ops/s (log), estimated")
        # bytes per token per layer: analytic (the estimate's) and the compiler's own
        self.bytes_plot.clear()
        plot_axes(self.bytes_plot)
        if self.bytes_plot.getPlotItem().legend is None:
            self.bytes_plot.addLegend(offset=(-10, 10))
        rows = res["layers"]
        names = ["out" if r["layer"] is None else f"L{r['layer']}" for r in rows]
        xs = np.arange(len(rows), dtype=float)
        comp = self.compiler_bytes if self.graph.currentData() == "decode" else {}
        width = 0.38 if comp else 0.7
        self.bytes_plot.addItem(pg.BarGraphItem(
            x=xs - (width / 2 if comp else 0), height=[r["dram_bytes"] / MIB for r in rows],
            width=width, brush="#6a4fb3", pen=None, name="analytic (estimated)"))
        if comp:
            self.bytes_plot.addItem(pg.BarGraphItem(
                x=xs + width / 2, width=width, brush="#0f8a8a", pen=None,
                height=[comp.get(r["layer"], 0.0) / MIB for r in rows],
                name="compiler, optrace (simulated compile)"))
        self.bytes_plot.getAxis("bottom").setTicks([list(enumerate(names))])
        self.bytes_plot.setLabel("left", "DRAM MiB per decode step (per layer)")
        top = max([r["dram_bytes"] for r in rows] + list(comp.values()) + [1.0]) / MIB
        self.bytes_plot.setYRange(0, top * 1.35, padding=0)  # room for the legend
        self.table.set_rows([
            Row(["outside layers" if r["layer"] is None else f"layer {r['layer']}",
                 _si(r["macs"], ""), format_bytes(int(r["dram_bytes"])),
                 f"{r['intensity']:.2f}" if r["intensity"] else "–",
                 f"{r['time_s'] * 1e6:.1f} µs",
                 "memory" if (r["intensity"] or 0) < ridge else "compute"],
                align_right=(1, 2, 3, 4))
            for r in rows
        ])
        self.note.setText(
            f"estimated · ridge at {ridge:.0f} ops/byte: {_si(peak, 'ops/s')} achievable "
            f"compute, {_si(bw, 'B/s')} achievable DDR bandwidth for {res['chip']} (catalog "
            "figures × fitted efficiencies). MACs and bytes are analytic, from the quantized "
            "ONNX graph (weights at their stored precision); per-op times are max(compute, "
            "memory) plus the fitted per-pass overhead in the step total."
            + ("" if not math.isnan(peak) else ""))
