"""An in-app view of an ONNX graph: its nodes laid out in rows (data flows down), each box
its op type, coloured by where it runs (the compile's placement: NPU or CPU) or, before a
compile, by the kind of op; the edges between them; zoom (wheel), pan (drag), find by node
name or op type, and a click that describes the node and, when it belongs to one of the
model's layers, opens that layer in the Precision page's grid.

Drawing: one graphics item per node box and one path for every edge, so the view of a
decoder part of a few thousand nodes builds in well under a second (the layout itself:
:mod:`studio.core.graphlayout`).
"""

from __future__ import annotations

from PySide6.QtCore import QPointF, QRectF, Qt, Signal
from PySide6.QtGui import QBrush, QColor, QFont, QPainter, QPainterPath, QPen
from PySide6.QtWidgets import (
    QGraphicsItem,
    QGraphicsPathItem,
    QGraphicsRectItem,
    QGraphicsScene,
    QGraphicsSimpleTextItem,
    QGraphicsView,
    QHBoxLayout,
    QLineEdit,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from studio.core.graphlayout import GraphLayout, layered_layout
from studio.ui.widgets import label

BOX_W, BOX_H = 150.0, 26.0
COL_STEP, ROW_STEP = 172.0, 48.0

#: op kinds -> colour (before a compile says where each node runs)
KIND_COLOURS = {
    "matmul": "#2f6fd6", "norm": "#1f8a4c", "attention": "#d68a00", "quant": "#8c8c8c",
    "elementwise": "#6a4fb3", "shape": "#9aa5b1", "other": "#5b6570",
}
NPU, CPU = "#2ca02c", "#d62728"


def op_kind(op_type: str) -> str:
    if op_type in ("MatMul", "Gemm", "Conv", "MatMulInteger", "QLinearMatMul"):
        return "matmul"
    if op_type in ("LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
                   "ReduceMean", "Sqrt", "Reciprocal", "Pow"):
        return "norm"
    if op_type in ("Softmax", "Where", "Gather", "GatherElements", "ScatterND", "Expand"):
        return "attention"
    if op_type in ("QuantizeLinear", "DequantizeLinear", "Cast"):
        return "quant"
    if op_type in ("Add", "Mul", "Sub", "Div", "Sigmoid", "Tanh", "Gelu", "Neg", "Erf", "Exp",
                   "Relu", "Max", "Min"):
        return "elementwise"
    if op_type in ("Reshape", "Transpose", "Concat", "Slice", "Split", "Unsqueeze", "Squeeze",
                   "Shape", "Flatten", "Identity", "Constant", "Range", "ConstantOfShape"):
        return "shape"
    return "other"


class _ZoomView(QGraphicsView):
    """Wheel zooms (under the mouse) instead of scrolling."""

    def wheelEvent(self, event) -> None:
        factor = 1.25 if event.angleDelta().y() > 0 else 0.8
        self.scale(factor, factor)


class _Box(QGraphicsRectItem):
    def __init__(self, index: int, rect: QRectF):
        super().__init__(rect)
        self.index = index
        self.setFlag(QGraphicsItem.GraphicsItemFlag.ItemIsSelectable, True)


class GraphView(QWidget):
    """``set_graph(OnnxGraph | None, placement=None)``. ``layerActivated`` asks the window to
    show a layer (module path) in the Precision page's grid."""

    layerActivated = Signal(str)
    nodeSelected = Signal(int)

    def __init__(self, parent=None) -> None:
        super().__init__(parent)
        self.graph = None
        self.layout_: GraphLayout | None = None
        self.placement: dict | None = None
        self.layers: set[str] = set()  # the model's layer (module) paths
        self.boxes: list[_Box] = []
        self.selected: int | None = None
        self.matches: list[int] = []
        self._match_at = -1
        lay = QVBoxLayout(self)
        lay.setContentsMargins(0, 0, 0, 0)
        bar = QHBoxLayout()
        self.find_box = QLineEdit()
        self.find_box.setPlaceholderText("Find a node by name or op type…")
        self.find_box.setClearButtonEnabled(True)
        self.find_box.textChanged.connect(self.find)
        self.find_box.returnPressed.connect(lambda: self.step(1))
        bar.addWidget(self.find_box, 1)
        self.find_label = label("", "muted")
        bar.addWidget(self.find_label)
        self.fit_button = QPushButton("Fit")
        self.fit_button.setToolTip("Zoom to the whole graph")
        self.fit_button.clicked.connect(self.fit)
        bar.addWidget(self.fit_button)
        self.layer_button = QPushButton("Show layer in the grid")
        self.layer_button.setToolTip("Select a node of one of the model's layers")
        self.layer_button.setEnabled(False)
        self.layer_button.clicked.connect(self._show_layer)
        bar.addWidget(self.layer_button)
        lay.addLayout(bar)
        self.legend = label("", "muted", wrap=True)
        self.legend.setTextFormat(Qt.TextFormat.RichText)
        lay.addWidget(self.legend)
        self.scene = QGraphicsScene(self)
        self.view = _ZoomView(self.scene)
        self.view.setRenderHint(QPainter.RenderHint.Antialiasing, False)
        self.view.setDragMode(QGraphicsView.DragMode.ScrollHandDrag)
        self.view.setTransformationAnchor(QGraphicsView.ViewportAnchor.AnchorUnderMouse)
        self.scene.selectionChanged.connect(self._selection_changed)
        lay.addWidget(self.view, 1)
        self.details = label("", "muted", wrap=True, selectable=True)
        lay.addWidget(self.details)
        self.empty = label("", "muted", wrap=True)
        lay.addWidget(self.empty)
        self.set_graph(None)

    # ---- data ---------------------------------------------------------------------------
    def set_graph(self, graph, placement: dict | None = None, layers: set[str] | None = None,
                  empty_text: str = "No graph to draw.") -> None:
        """Draw ``graph`` (an ``OnnxGraph``); ``placement``: the compile's record for it
        (``cpu_nodes``: the nodes the HTP refused), which colours the boxes NPU / CPU;
        ``layers``: the model's layer paths (a node of one links to the grid)."""
        self.scene.clear()
        self.boxes = []
        self.graph, self.placement = graph, placement
        self.layers = set(layers or ())
        self.selected = None
        self.matches, self._match_at = [], -1
        has = graph is not None and bool(graph.nodes)
        for w in (self.view, self.find_box, self.fit_button, self.layer_button, self.legend,
                  self.details):
            w.setVisible(has)
        self.empty.setVisible(not has)
        self.empty.setText(empty_text)
        if not has:
            self.layout_ = None
            return
        nodes = graph.nodes
        self.layout_ = layered_layout([(n.inputs, [o for o, _ in n.outputs]) for n in nodes])
        cpu = set((placement or {}).get("cpu_nodes") or [])
        font = QFont()
        font.setPointSizeF(8.5)
        pen = QPen(QColor("#30343a"))
        pen.setCosmetic(True)
        for i, n in enumerate(nodes):
            x, y = self._xy(i)
            box = _Box(i, QRectF(x - BOX_W / 2, y, BOX_W, BOX_H))
            colour = (CPU if n.name in cpu else NPU) if placement is not None else \
                KIND_COLOURS[op_kind(n.op_type)]
            fill = QColor(colour)
            fill.setAlpha(70)
            box.setBrush(QBrush(fill))
            box.setPen(pen)
            box.setToolTip(self.describe(i))
            text = QGraphicsSimpleTextItem(n.op_type, box)
            text.setFont(font)
            r = text.boundingRect()
            text.setPos(x - r.width() / 2, y + (BOX_H - r.height()) / 2)
            self.scene.addItem(box)
            self.boxes.append(box)
        path = QPainterPath()
        for p, c in self.layout_.edges:
            x0, y0 = self._xy(p)
            x1, y1 = self._xy(c)
            a, b = QPointF(x0, y0 + BOX_H), QPointF(x1, y1)
            mid = (a.y() + b.y()) / 2
            path.moveTo(a)
            path.cubicTo(QPointF(a.x(), mid), QPointF(b.x(), mid), b)
        edge_pen = QPen(QColor(120, 120, 120, 150))
        edge_pen.setCosmetic(True)
        edges = QGraphicsPathItem(path)
        edges.setPen(edge_pen)
        edges.setZValue(-1)
        self.scene.addItem(edges)
        if placement is not None:
            n_cpu = sum(1 for n in nodes if n.name in cpu)
            self.legend.setText(
                f"<span style='color:{NPU}'>■</span> on the NPU ({len(nodes) - n_cpu:,}) "
                f"&nbsp; <span style='color:{CPU}'>■</span> on the CPU ({n_cpu:,}) · "
                f"{len(nodes):,} nodes in {self.layout_.rows:,} rows · where each runs: the "
                "compile's placement (measured by the QNN EP)")
        else:
            self.legend.setText("  ".join(
                f"<span style='color:{c}'>■</span> {k}" for k, c in KIND_COLOURS.items())
                + f" · {len(nodes):,} nodes in {self.layout_.rows:,} rows")
        self.find(self.find_box.text())
        self.fit()

    def _xy(self, i: int) -> tuple[float, float]:
        col, row = self.layout_.pos[i]
        return col * COL_STEP, row * ROW_STEP

    def describe(self, i: int) -> str:
        n = self.graph.nodes[i]
        outs = ", ".join(f"{o} {list(s)}" for o, s in n.outputs[:2])
        where = ""
        if self.placement is not None:
            where = " · CPU (refused by the HTP)" if n.name in set(
                self.placement.get("cpu_nodes") or []) else " · NPU"
        layer = f" · layer {n.module}" if n.module in self.layers else ""
        params = f" · {n.params:,} parameters" if n.params else ""
        return f"{n.name} · {n.op_type}{where}{layer}{params} · out {outs}"

    # ---- navigation ---------------------------------------------------------------------
    def fit(self) -> None:
        if self.boxes:
            self.view.fitInView(self.scene.itemsBoundingRect(), Qt.AspectRatioMode.KeepAspectRatio)
            if self.view.transform().m11() < 0.05:  # a long graph: start readable, at the top
                self.view.resetTransform()
                self.view.scale(0.6, 0.6)
                self.view.centerOn(self.boxes[0])

    def select(self, i: int) -> None:
        """Select node ``i`` and centre the view on it."""
        self.scene.clearSelection()
        box = self.boxes[i]
        box.setSelected(True)
        if self.view.transform().m11() < 0.5:
            self.view.resetTransform()
        self.view.centerOn(box)

    def select_module(self, module: str) -> int:
        """Select the first node of ``module`` (a layer path); returns how many nodes it has."""
        hits = [i for i, n in enumerate(self.graph.nodes if self.graph else [])
                if n.module == module or n.module.startswith(module + ".")]
        if hits:
            self.select(hits[0])
        return len(hits)

    def _selection_changed(self) -> None:
        sel = [b for b in self.scene.selectedItems() if isinstance(b, _Box)]
        if not sel:
            self.selected = None
            self.details.setText("")
            self.layer_button.setEnabled(False)
            return
        i = sel[0].index
        self.selected = i
        self.details.setText(self.describe(i))
        module = self.graph.nodes[i].module
        ok = module in self.layers
        self.layer_button.setEnabled(ok)
        self.layer_button.setToolTip(f"Open {module} in the Precision page's grid" if ok else
                                     "This node belongs to no layer the recipe sets")
        self.nodeSelected.emit(i)

    def _show_layer(self) -> None:
        if self.selected is not None:
            self.layerActivated.emit(self.graph.nodes[self.selected].module)

    # ---- search -------------------------------------------------------------------------
    def find(self, text: str) -> int:
        needle = text.strip().lower()
        self.matches, self._match_at = [], -1
        if self.graph is None or not needle:
            self.find_label.setText("")
            return 0
        self.matches = [i for i, n in enumerate(self.graph.nodes)
                        if needle in n.name.lower() or needle == n.op_type.lower()]
        self.find_label.setText(f"{len(self.matches):,} node(s)" if self.matches
                                else "no such node")
        return len(self.matches)

    def step(self, delta: int) -> int | None:
        if not self.matches:
            return None
        self._match_at = (self._match_at + delta) % len(self.matches)
        i = self.matches[self._match_at]
        self.select(i)
        self.find_label.setText(f"{self._match_at + 1:,} of {len(self.matches):,}")
        return i
