"""The Profiler's Memory tab: activation memory of the prefill / decode graphs with one
buffer per tensor (naive) vs buffers reused by tensor lifetime, the live bytes step by step,
the largest tensors at the peak, and the weight and KV cache bytes beside them."""

from __future__ import annotations

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

from studio.core import figures
from studio.core.errors import StudioError
from studio.core.units import format_bytes
from studio.services.memory import graphs_memory, project_memory
from studio.ui.loading import LatestLoad
from studio.ui.models.rows import Row, RowsModel
from studio.ui.pages.cards import CardGrid, FigureCard
from studio.ui.stages import role_of
from studio.ui.widgets import SourceBadge, label, plot_axes, plot_message, theme_plot


class MemoryTab(QWidget):
    loaded = Signal()

    def __init__(self, ctl, pg, parent=None):
        super().__init__(parent)
        self.ctl, self.pg = ctl, pg
        self.result: dict | None = None
        self.graphs: dict = {}  # {stage: {graph: path}} of the shown profile, or {}
        self._load = LatestLoad(ctl)
        lay = QVBoxLayout(self)
        row = QHBoxLayout()
        row.addWidget(label("Graph:"))
        self.graph = QComboBox()
        self.graph.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        # as wide from the start as once the graphs are listed: the row does not jump
        self.graph.setMinimumWidth(self.graph.fontMetrics().horizontalAdvance(
            "decode · quantized (QDQ) (quantize)") + 40)
        self.graph.currentIndexChanged.connect(self._draw)
        row.addWidget(self.graph)
        self.status = label("", "muted", wrap=True)
        row.addWidget(self.status, 1)
        # one source for the tab's figures (they are planned together): one badge, not five
        self.badge = SourceBadge("estimated", "planned from the graph's static shapes")
        row.addWidget(self.badge)
        lay.addLayout(row)
        # each card keeps room for a value up to "888.8 MiB" and a line under it from the
        # start: the cards do not reflow (nor push the chart) when the plan arrives
        size = "888.8 MiB"
        self.cards = {
            "naive": FigureCard("Naive: a buffer per tensor", "–", "estimated", "–",
                                reserve=size),
            "arena": FigureCard("Reuse by lifetime", "–", "estimated", "–", reserve=size),
            "bound": FigureCard("Peak live (bound)", "–", "estimated", "–", reserve=size),
            "weights": FigureCard(figures.title("graph_weight_bytes"), "–", "estimated", "–",
                                  reserve=size),
            "kv": FigureCard(figures.title("kv_cache_graph_io_bytes"), "–", "estimated", "–",
                             reserve=size),
        }
        self.cards["weights"].setToolTip(figures.tip("graph_weight_bytes"))
        self.cards["kv"].setToolTip(figures.tip("kv_cache_graph_io_bytes"))
        for card in self.cards.values():
            card.badge.hide()
        self.card_grid = CardGrid()
        self.card_grid.set_cards(list(self.cards.values()))
        lay.addWidget(self.card_grid)
        split = QSplitter()
        self.plot = pg.PlotWidget()
        self.plot.setMenuEnabled(False)
        self.plot.showGrid(x=False, y=True, alpha=0.3)
        self.plot.addLegend(offset=(-10, 10))
        split.addWidget(self.plot)
        self.peak = RowsModel(["Tensor live at the peak", "Bytes", "Made by"], self)
        view = QTableView()
        view.setModel(self.peak)
        view.verticalHeader().hide()
        head = view.horizontalHeader()
        head.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        head.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        head.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        view.setWordWrap(False)
        view.setTextElideMode(Qt.TextElideMode.ElideLeft)
        split.addWidget(view)
        split.setSizes([640, 460])
        lay.addWidget(split, 1)
        self.note = label("", "muted", wrap=True)
        self.note.setMinimumHeight(self.note.fontMetrics().lineSpacing())  # a line kept for it
        lay.addWidget(self.note)
        self.apply_theme()
        plot_message(self.plot, "No memory plan yet: it is made when this tab is shown")

    def apply_theme(self) -> None:
        theme_plot(self.plot, self.palette())

    # ---- loading (off the UI thread) ---------------------------------------------------------
    def load(self) -> None:
        studio = self.ctl.studio
        if studio is None:
            return
        project = studio.project.copy()
        self.status.setText("Planning the graphs' memory…")
        plot_message(self.plot, "Planning the graphs' memory…")

        graphs = dict(self.graphs)

        def work() -> dict:
            return graphs_memory(graphs) if graphs else project_memory(project)

        def done(got: dict) -> None:
            self.show_result(got)
            self.loaded.emit()

        def failed(exc: Exception) -> None:
            self.result = None
            self.status.setText(exc.message if isinstance(exc, StudioError)
                                else f"memory planning failed: {exc!r}")
            plot_message(self.plot, "No memory plan: " + (
                exc.message if isinstance(exc, StudioError) else "the planning failed"))
            self.loaded.emit()

        self._load.start(work, done=done, failed=failed)

    def show_result(self, result: dict) -> None:
        self.result = result
        current = self.graph.currentData()
        self.graph.blockSignals(True)
        self.graph.clear()
        for stage, graphs in result["stages"].items():
            for g in graphs:
                what = "FP32" if role_of(stage) == "export" else "quantized (QDQ)"
                self.graph.addItem(f"{g} · {what} ({stage})", (stage, g))
        idx = self.graph.findData(current)
        self.graph.setCurrentIndex(max(idx, 0))
        self.graph.blockSignals(False)
        missing = result.get("missing") or []
        self.status.setText(
            f"no {', '.join(missing)} result for the current settings" if missing else "")
        self._draw()

    def _draw(self, *_args) -> None:
        if not self.result or self.graph.currentData() is None:
            if self.result is not None:  # planned, but no graph of the current settings
                plot_message(self.plot, "No exported graph to plan yet: run the export stage")
            return
        stage, g = self.graph.currentData()
        mem = self.result["stages"][stage][g]
        p = mem["plan"]
        src = mem.get("source", "estimated")
        kv_in, kv_out = mem["kv_cache_bytes"], mem.get("kv_output_bytes", 0)
        saving = p["reuse_saving"]
        graph = f"{stage} · {g}"
        values = {  # (the figure, the line under it)
            "naive": (format_bytes(p["naive_bytes"]), "no buffer reused"),
            "arena": (format_bytes(p["arena_bytes"]),
                      f"{saving:.0%} less than naive" if round(saving * 100)
                      else "no less than naive"),
            "bound": (format_bytes(p["lower_bound_bytes"]),
                      f"at step {p['peak_step']} of {p['steps']}"),
            "weights": (figures.fmt("graph_weight_bytes", mem["weight_bytes"]),
                        "initializers, as stored"),
            "kv": (figures.fmt("kv_cache_graph_io_bytes", kv_in + kv_out),
                   f"{format_bytes(kv_in)} in, {format_bytes(kv_out)} out"),
        }
        for key, (text, where) in values.items():
            self.cards[key].value.setText(text)
            self.cards[key].where.setText(where)
            self.cards[key].badge.set_source(src)
        self.badge.set_source(src, "planned from the graph's static shapes, not measured")
        for key, name in (("weights", "graph_weight_bytes"), ("kv", "kv_cache_graph_io_bytes")):
            # one figure per graph (the graph picker above names the graph it counts)
            self.cards[key].figure = (name, graph, "")
        pg = self.pg
        self.plot.clear()
        plot_axes(self.plot)
        mib = float(2**20)  # binary units, as every byte figure of the studio is written
        live = [v / mib for v in p["live_bytes"]]
        xs = list(range(len(live)))
        fg = self.palette().text().color()
        self.plot.plot(xs, live, pen=pg.mkPen("#2f6fd6", width=1.5), name="live bytes")
        self.plot.addItem(pg.InfiniteLine(pos=p["arena_bytes"] / mib, angle=0,
                                          pen=pg.mkPen("#1f8a4c", width=1.5, style=Qt.PenStyle.DashLine),
                                          label="arena with reuse", labelOpts={"color": fg}))
        self.plot.addItem(pg.InfiniteLine(pos=p["naive_bytes"] / mib, angle=0,
                                          pen=pg.mkPen("#d64545", width=1.5, style=Qt.PenStyle.DashLine),
                                          label="naive", labelOpts={"color": fg}))
        if p["peak_step"] >= 0:
            self.plot.addItem(pg.InfiniteLine(pos=p["peak_step"], angle=90,
                                              pen=pg.mkPen(fg, width=1, style=Qt.PenStyle.DotLine)))
        self.plot.setLabel("bottom", "op (graph order)")
        self.plot.setLabel("left", "activation MiB")
        self.peak.set_rows([
            Row([t["name"], format_bytes(t["nbytes"]), t.get("op_type", "") or "input"],
                tip=f"{t['name']}: made by {t.get('producer', '') or 'the graph input'}",
                align_right=(1,))
            for t in p["peak_tensors"]
        ])
        notes = mem.get("notes") or []
        self.note.setText(
            f"Peak at step {p['peak_step']} of {p['steps']}: {p['peak_op_type']} "
            f"{p['peak_node']}. {src}: planned from the graph's static shapes, not measured. "
            + " ".join(notes if isinstance(notes, list) else [str(notes)]))
