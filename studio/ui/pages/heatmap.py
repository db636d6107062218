"""The sensitivity panel of the Precision page: a ranked bar chart of the layers that gain
most when raised, or, without a result, how to get one.

One ``BarGraphItem`` draws the bars; a click on a bar asks the grid to select that layer.
Every figure is the sensitivity stage's own: measured on the host CPU (the host QDQ prefill
graph, not the HTP), with the metric, the precision the layer was raised to and the
held-out tokens named beside the chart.
"""

from __future__ import annotations

from PySide6.QtCore import QEvent, QPointF, Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QStackedWidget, QVBoxLayout, QWidget

from studio.core.lazyimport import lazy_module
from studio.core.recipe import block_prefix
from studio.services import sensitivity as sens
from studio.ui.models.layergrid import HEAT_HIGH, HEAT_LOW
from studio.ui.theme import mix
from studio.ui.widgets import EmptyState, SourceBadge, label, theme_plot

pg = lazy_module("pyqtgraph")

TOP_N = 12


def bar_label(layer: str) -> str:
    """``model.layers.3.mlp.down_proj`` -> ``3 · mlp.down_proj``; others unchanged."""
    prefix = block_prefix(layer)
    if prefix and layer.startswith(prefix + "."):
        return f"{prefix.rsplit('.', 1)[-1]} · {layer[len(prefix) + 1:]}"
    return layer


class HeatPanel(QWidget):
    """The ranked chart (``chart``) or the empty state (``empty``)."""

    #: a bar was clicked: select this layer
    layer_clicked = Signal(str)

    def __init__(self, parent=None):
        super().__init__(parent)

        self.pg = pg
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        self.stack = QStackedWidget()
        lay.addWidget(self.stack)
        self.empty = EmptyState("No sensitivity result", "")
        self.run_button = self.empty.add_action(
            "Run sensitivity", lambda: None,
            "Queue the sensitivity stage (and the export it needs) for this project")
        self.empty.text.setMinimumWidth(480)
        self.stack.addWidget(self.empty)
        self.chart = QWidget()
        cl = QVBoxLayout(self.chart)
        cl.setContentsMargins(0, 0, 0, 0)
        head = QHBoxLayout()
        self.title = label("", wrap=True)
        head.addWidget(self.title, 1)
        self.badge = SourceBadge("measured")
        head.addWidget(self.badge, 0, Qt.AlignmentFlag.AlignTop)
        cl.addLayout(head)
        self.stale = label("", "error", wrap=True)
        self.stale.hide()
        cl.addWidget(self.stale)
        self.plot = pg.PlotWidget()
        self.plot.setMenuEnabled(False)
        self.plot.showGrid(x=True, y=False, alpha=0.3)
        self.plot.getPlotItem().invertY(True)
        self.plot.setMouseEnabled(x=False, y=False)
        self.plot.hideButtons()
        self.plot.scene().sigMouseClicked.connect(self._clicked)
        cl.addWidget(self.plot, 1)
        self.stack.addWidget(self.chart)
        self._bars = None
        self.shown: list[tuple[str, float]] = []
        self._theme()

    def changeEvent(self, event) -> None:
        super().changeEvent(event)
        if event.type() == QEvent.Type.PaletteChange and hasattr(self, "plot"):
            self._theme()  # a theme switch reaches this chart too

    def _theme(self) -> None:
        theme_plot(self.plot, self.palette())

    # ---- states -------------------------------------------------------------------------------
    def show_empty(self, project_path, why: str = "") -> None:
        self.empty.set_text(
            "No sensitivity result for this project",
            (why + "<br><br>" if why else "")
            + "The heat map colours each layer by how much raising it alone (to FP16 over "
            "W8A16, INT16 over W8A8, its weights to INT8 over W4A16) improves accuracy against "
            "FP32, measured on the host CPU. "
            "To get it: " + sens.how_to_run(project_path).replace("(", "<br>(", 1)
            + ". It takes about a minute on the sample model.",
        )
        self.stack.setCurrentWidget(self.empty)
        self.shown = []

    def show_result(self, result: dict, metric: str = "kl_divergence") -> None:
        data = result["data"]
        key, title, unit, _ = sens.HEAT_METRICS[metric]
        self.shown = sens.ranked(data, metric, TOP_N)
        held = data.get("heldout", {})
        self.title.setToolTip(sens.HEAT_HELP[metric])
        self.title.setText(
            f"<b>Most sensitive layers</b> — {title}{f' ({unit})' if unit else ''} when the "
            f"layer alone is raised to {data.get('high', '?')} over {data.get('scheme', '?')}; "
            f"{data.get('graph', 'prefill')} graph, {held.get('tokens', '?')} held-out tokens "
            f"(job #{result['job']}). Click a bar to select the layer."
            + self._htp_note(data))
        self.badge.set_source(data.get("source", "measured"),
                              f"{data.get('device', 'host-cpu')}: the host QDQ model, not the HTP")
        self.stale.setVisible(not result["current"])
        self.stale.setText(f"Stale: {result['stale_because']}. Run sensitivity again for the "
                           "current settings." if not result["current"] else "")
        self.plot.clear()
        self._bars = None
        if self.shown:
            vmax = max(v for _, v in self.shown) or 1.0
            brushes = [mix(HEAT_LOW, HEAT_HIGH, max(0.0, v) / vmax) for _, v in self.shown]
            self._bars = self.pg.BarGraphItem(
                x0=[0.0] * len(self.shown), y=list(range(len(self.shown))), height=0.7,
                width=[v for _, v in self.shown], brushes=brushes, pen=None)
            self.plot.addItem(self._bars)
            self.plot.getAxis("left").setTicks(
                [[(i, bar_label(n)) for i, (n, _) in enumerate(self.shown)]])
            self.plot.setLabel("bottom", f"{title}{f' ({unit})' if unit else ''} · "
                               f"{data.get('source', 'measured')} on {data.get('device', '')}")
            lo = min(0.0, min(v for _, v in self.shown))
            self.plot.setYRange(-0.6, len(self.shown) - 0.4, padding=0)
            self.plot.setXRange(lo, vmax * 1.05, padding=0)
        self.stack.setCurrentWidget(self.chart)

    @staticmethod
    def _htp_note(data: dict) -> str:
        htp = data.get("htp")
        if not htp or not htp.get("tried"):
            return ""
        return (f" On the HTP simulator ({htp.get('chip', '?')}, simulated), "
                f"{htp.get('host_gain_confirmed', 0)} of the top {htp['tried']} gains hold.")

    # ---- clicks -----------------------------------------------------------------------------------
    def bar_at(self, scene_pos: QPointF) -> str | None:
        vb = self.plot.getPlotItem().getViewBox()
        if not self.shown or not vb.sceneBoundingRect().contains(scene_pos):
            return None
        y = vb.mapSceneToView(scene_pos).y()
        i = int(round(y))
        if 0 <= i < len(self.shown) and abs(y - i) <= 0.4:
            return self.shown[i][0]
        return None

    def bar_center(self, i: int) -> QPointF:
        """Where bar ``i`` is drawn, in the plot widget's coordinates (for tests)."""
        vb = self.plot.getPlotItem().getViewBox()
        name, value = self.shown[i]
        scene = vb.mapViewToScene(QPointF(max(value, 0.0) / 2, i))
        return self.plot.mapFromScene(scene)

    def _clicked(self, event) -> None:
        name = self.bar_at(event.scenePos())
        if name is not None:
            self.layer_clicked.emit(name)
