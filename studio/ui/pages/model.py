"""Model: blocks → modules → ONNX nodes (once exported), with shapes and parameter counts;
and the graph itself (the export's FP32 graphs, the quantized ones with where each node runs
after a compile) drawn in the window, linked to the Precision page's layer grid."""

from __future__ import annotations

import asyncio

from PySide6.QtCore import QSortFilterProxyModel, Qt
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QTabWidget,
    QTreeView,
    QVBoxLayout,
    QWidget,
)

from studio.core.errors import StudioError
from studio.core.modelinfo import ModelInfo
from studio.core.units import format_bytes
from studio.services import deviceplan, history, projects, prompts
from studio.ui.graph_view import GraphView
from studio.ui.models.model_tree import ModelTreeModel, NodeRole, build_tree
from studio.ui.pages.base import Page
from studio.ui.stages import role_of
from studio.ui.standalone import run_page
from studio.ui.widgets import label

NETRON_HINT = (
    "Netron is not installed. Install it to open the exported graphs in Netron "
    "from here: pip install netron"
)


class ModelPage(Page):
    key = "model"

    def __init__(self, ctl, parent=None):
        super().__init__(ctl, parent)
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(0, 6, 0, 0)
        self._build_bar(lay)
        self._build_info(lay)
        self._build_tabs(lay)
        self._drawn: tuple | None = None  # what the graph view shows
        self._pending_layer: str | None = None  # a layer to select once the graph is drawn

        self._graphs: dict[str, object] = {}
        self._graph_paths: dict[str, object] | None = None  # None: not looked yet
        self._graph_files: dict[str, history.GraphFile] = {}
        self._loading: asyncio.Future | None = None
        self._plan_loading: asyncio.Future | None = None
        self._netron = projects.netron_available()
        self.netron_button.setVisible(self._netron)
        self.netron_hint.setVisible(not self._netron)
        ctl.model_ready.connect(self._model_ready)

    def _build_bar(self, lay: QVBoxLayout) -> None:
        """The search box, the graph chooser, Netron and Expand blocks."""
        bar = QHBoxLayout()
        self.search = QLineEdit()
        self.search.setPlaceholderText("Find a layer or node (e.g. q_proj, MatMul)")
        self.search.setClearButtonEnabled(True)
        self.search.textChanged.connect(self._filter)
        bar.addWidget(self.search, 1)
        self.graph_label = label("ONNX graph:", "muted")
        bar.addWidget(self.graph_label)
        self.graph_combo = QComboBox()
        self.graph_combo.setToolTip("Which graph to show: its nodes under each module (Layers) "
                                    "and drawn (Graph)")
        self.graph_combo.currentTextChanged.connect(self._graph_chosen)
        bar.addWidget(self.graph_combo)
        self.netron_button = QPushButton("Open in Netron")
        self.netron_button.clicked.connect(self.open_netron)
        bar.addWidget(self.netron_button)
        self.netron_hint = label("Open in Netron: pip install netron", "muted")
        self.netron_hint.setToolTip(NETRON_HINT)
        bar.addWidget(self.netron_hint)
        self.expand_button = QPushButton("Expand blocks")
        self.expand_button.clicked.connect(self._expand_blocks)
        bar.addWidget(self.expand_button)
        lay.addLayout(bar)

    def _build_info(self, lay: QVBoxLayout) -> None:
        """The status line with Run export, and the hidden lines of the parts plan, the
        prompts and the device memory plan (with its table)."""
        info = QHBoxLayout()
        self.status = label("", "muted", wrap=True)
        info.addWidget(self.status, 1)
        self.export_button = QPushButton("Run export")
        self.export_button.setToolTip(
            "Export the FP32 prefill/decode ONNX graphs (the export stage)"
        )
        self.export_button.clicked.connect(lambda: self.run_role("export"))
        info.addWidget(self.export_button)
        lay.addLayout(info)
        self.plan = label("", "muted", wrap=True, selectable=True)
        self.plan.setToolTip("How the export splits the model into parts (export.parts, "
                             "export.max_part_mb) and the peak memory each stage over a part "
                             "is predicted to take on this machine")
        self.plan.hide()
        lay.addWidget(self.plan)
        # how prompts reach the model (its chat template) and a VL model's image and lengths
        self.prompts = label("", "muted", wrap=True, selectable=True)
        self.prompts.setToolTip("The checkpoint's chat template (model.chat_template) and, "
                                "for a vision-language model, its image size and lengths "
                                "with the source of each number (studio info shows the same)")
        self.prompts.hide()
        lay.addWidget(self.prompts)
        # the device memory plan: what each target's NPU maps, every figure with its source
        self.device_plan = label("", "muted", wrap=True, selectable=True)
        self.device_plan.setToolTip("What the NPU maps for the bundle, per target, against the "
                                    "chip catalog's limits (studio info shows the same)")
        self.device_plan.hide()
        lay.addWidget(self.device_plan)
        self.device_table = QTableWidget(0, 5)
        self.device_table.setHorizontalHeaderLabels(["target", "what", "size", "source",
                                                      "how"])
        self.device_table.verticalHeader().hide()
        self.device_table.setEditTriggers(QTableWidget.EditTrigger.NoEditTriggers)
        self.device_table.horizontalHeader().setStretchLastSection(True)
        self.device_table.setMaximumHeight(160)
        self.device_table.hide()
        lay.addWidget(self.device_table)

    def _build_tabs(self, lay: QVBoxLayout) -> None:
        """The Layers tab (the model tree and the details line) and the Graph tab."""
        self.model = ModelTreeModel(self)
        self.proxy = QSortFilterProxyModel(self)
        self.proxy.setSourceModel(self.model)
        self.proxy.setRecursiveFilteringEnabled(True)
        self.proxy.setFilterCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.proxy.setFilterKeyColumn(-1)
        self.tree = QTreeView()
        self.tree.setModel(self.proxy)
        self.tree.setUniformRowHeights(True)
        self.tree.setAlternatingRowColors(True)
        self.tree.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        hh = self.tree.header()
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.Interactive)
        hh.resizeSection(0, 330)
        hh.resizeSection(1, 150)
        hh.resizeSection(2, 260)
        hh.setStretchLastSection(True)
        self.tree.selectionModel().currentChanged.connect(self._current_changed)
        self.tabs = QTabWidget()
        layers_tab = QWidget()
        tl = QVBoxLayout(layers_tab)
        tl.setContentsMargins(0, 4, 0, 0)
        tl.addWidget(self.tree, 1)
        self.details = label("", "muted", wrap=True, selectable=True)
        tl.addWidget(self.details)
        self.tabs.addTab(layers_tab, "Layers")
        self.graph_view = GraphView()
        self.graph_view.layerActivated.connect(self.layerActivated.emit)
        self.tabs.addTab(self.graph_view, "Graph")
        self.tabs.currentChanged.connect(lambda *_: self._draw_graph())
        lay.addWidget(self.tabs, 1)

    # ---- session ------------------------------------------------------------------------------
    def on_open(self) -> None:
        self._graphs.clear()
        self._graph_paths = None
        self.model.set_root(build_tree())
        self.status.setText("Reading the model…")
        self._refresh_graphs()
        if self.ctl.model is not None:
            self._model_ready(self.ctl.model)
        else:
            self.ctl.load_model()

    def on_close(self) -> None:
        self.plan.hide()
        self.prompts.hide()
        self.device_plan.hide()
        self.device_table.hide()
        self.model.set_root(build_tree())
        self._graphs.clear()

    def on_job_event(self, job) -> None:
        if job.state == "succeeded" and role_of(job.stage) in ("export", "quantize", "compile"):
            self.later(self._refresh_graphs, 200)

    def _refresh_graphs(self) -> None:
        files = history.graph_files(self.ctl.studio)
        if files == self._graph_files and self._graph_paths is not None:
            return  # the same graphs, placed the same
        self._graph_files = files
        paths = {k: f.path for k, f in files.items()}
        self._graph_paths = paths
        self._graphs.clear()
        current = self.graph_combo.currentText()
        self.graph_combo.blockSignals(True)
        self.graph_combo.clear()
        self.graph_combo.addItems(list(paths))
        if current in paths:
            self.graph_combo.setCurrentText(current)
        self.graph_combo.blockSignals(False)
        have = bool(paths)
        onnx_project = isinstance(self.ctl.model, projects.OnnxGraph)
        self.graph_combo.setVisible(have)
        self.graph_label.setVisible(have)
        self.export_button.setVisible(not have and not onnx_project)
        self.netron_button.setEnabled(have or onnx_project)
        self.netron_button.setToolTip(
            "Open the selected graph in Netron (in the browser)"
            if have or onnx_project
            else "Run the export stage first: Netron opens the exported ONNX graphs"
        )
        if have:
            self._graph_chosen(self.graph_combo.currentText())
        elif isinstance(self.ctl.model, ModelInfo):
            self._rebuild()

    # ---- building the tree ----------------------------------------------------------------------
    def _model_ready(self, info) -> None:
        if self.ctl.studio is None:
            return
        if isinstance(info, StudioError):
            self.status.setText(f"Cannot read the model: {info.message}")
            self.export_button.hide()
            return
        if isinstance(info, projects.OnnxGraph):
            self.export_button.hide()
            self.graph_combo.hide()
            self.graph_label.hide()
            self.netron_button.setEnabled(True)
            self.netron_button.setToolTip(f"Open {info.path.name} in Netron (in the browser)")
        self._rebuild()
        self._load_plan()

    def _load_plan(self) -> None:
        """The part plan and its predicted peak memory, read in a thread (weight headers)."""
        studio = self.ctl.studio
        if studio is None:
            return
        project = studio.project.copy()

        async def load():
            try:
                plan = await self.ctl.in_thread(projects.part_plan, project)
            except StudioError as exc:
                text = f"Plan: {exc.message}"
            else:
                text = plan.text() if plan is not None else ""
            device = await self.ctl.in_thread(deviceplan.plans_dict, project)
            notes = await self.ctl.in_thread(prompts.project_lines, project)
            if self.ctl.studio is studio:
                self.plan.setText(text)
                self.plan.setVisible(bool(text))
                self.prompts.setText("\n".join(  # "prompts   chat template…" -> "Prompts: …"
                    f"{n.split(None, 1)[0].capitalize()}: {n.split(None, 1)[1]}"
                    for n in notes))
                self.prompts.setVisible(bool(notes))
                self._show_device_plan(device)

        self._plan_loading = asyncio.ensure_future(load())

    def _show_device_plan(self, data: dict) -> None:
        """The device memory plan: a line per target and a small table of its rows."""
        plans = data.get("plans")
        draft = [data["draft_table"]["line"]] if data.get("draft_table") else []
        if not plans:
            lines = ([f"Device plan: {data['why']}"] if data.get("why") else []) + draft
            self.device_plan.setText("\n".join(lines))
            self.device_plan.setVisible(bool(lines))
            self.device_table.hide()
            return
        self.device_plan.setText("\n".join([p["summary"] for p in plans] + draft))
        self.device_plan.show()
        rows = [(p["chip"], r) for p in plans for r in p["rows"]]
        self.device_table.setRowCount(len(rows))
        for i, (chip, r) in enumerate(rows):
            size = "unknown" if r["bytes"] is None else format_bytes(r["bytes"])
            for j, text in enumerate((chip, r["what"], size, r["source"], r["detail"])):
                item = QTableWidgetItem(text)
                item.setToolTip(r["detail"])
                self.device_table.setItem(i, j, item)
        self.device_table.resizeColumnsToContents()
        self.device_table.show()

    def _graph_chosen(self, name: str) -> None:
        if not name or self.ctl.studio is None:
            return
        if name in self._graphs:
            self._rebuild()
            return
        path = (self._graph_paths or {}).get(name)
        if path is None:
            return
        self.status.setText(f"Reading {name}.onnx…")

        async def load():
            try:
                graph = await self.ctl.in_thread(projects.read_onnx_graph, path)
            except StudioError as exc:
                self.status.setText(exc.message)
                return
            self._graphs[name] = graph
            if self.graph_combo.currentText() == name:
                self._rebuild()

        self._loading = asyncio.ensure_future(load())

    def _rebuild(self) -> None:
        info = self.ctl.model
        if info is None or isinstance(info, StudioError):
            return
        if isinstance(info, projects.OnnxGraph):
            root = build_tree(None, info)
            self.status.setText(
                f"{len(info.nodes):,} nodes of {info.path.name}, grouped by block and module."
            )
        else:
            name = self.graph_combo.currentText()
            graph = self._graphs.get(name) if self._graph_paths else None
            root = build_tree(info, graph)
            n_mod = len(info.layers)
            if graph is not None:
                self.status.setText(
                    f"{info.num_layers} blocks, {n_mod} weight modules, and the {len(graph.nodes):,} "
                    f"nodes of the {name} graph (shapes from ONNX shape inference)."
                )
            elif self._graph_paths:
                self.status.setText(
                    f"{info.num_layers} blocks, {n_mod} weight modules; reading the exported graph…"
                )
            else:
                self.status.setText(
                    f"{info.num_layers} blocks, {n_mod} weight modules. Run the export stage to "
                    "see each module's ONNX nodes (with their shapes) here."
                )
        self.model.set_root(root)
        self._expand_blocks(first_only=True)
        self._filter(self.search.text())
        self._draw_graph()

    def _draw_graph(self) -> None:
        """Draw the chosen graph when the Graph tab is shown (and it changed)."""
        if self.tabs.currentWidget() is not self.graph_view or self.ctl.studio is None:
            return
        info = self.ctl.model
        if isinstance(info, projects.OnnxGraph):
            key: tuple = ("onnx", str(info.path))
            graph, placement, layers = info, None, set()
        else:
            name = self.graph_combo.currentText()
            graph = self._graphs.get(name)
            gf = self._graph_files.get(name)
            placement = gf.placement if gf is not None else None
            layers = {lay.name for lay in info.layers} if isinstance(info, ModelInfo) else set()
            key = (name, id(graph), str(placement))
        if key == self._drawn:
            return
        self._drawn = key
        empty = ("Run the export stage first: the graph view draws the exported ONNX graphs."
                 if not self._graph_paths else "Reading the graph…")
        self.graph_view.set_graph(graph, placement, layers, empty_text=empty)
        self._select_pending()

    def reveal_layer(self, name: str) -> bool:
        """Show the layer's nodes selected in the drawn graph (now, or once the graph is
        read); False when there is no graph to draw."""
        if not self._graph_paths and not isinstance(self.ctl.model, projects.OnnxGraph):
            return False
        self._pending_layer = name
        self.tabs.setCurrentWidget(self.graph_view)  # -> _draw_graph
        self._select_pending()
        return True

    def _select_pending(self) -> None:
        name = self._pending_layer
        if name and self.graph_view.graph is not None:
            self._pending_layer = None
            if not self.graph_view.select_module(name):
                self.ctl.message.emit("info", f"{name} has no node in this graph")

    def _expand_blocks(self, first_only: bool = False) -> None:
        for r in range(self.proxy.rowCount()):
            idx = self.proxy.index(r, 0)
            name = idx.data()
            if not first_only or name in ("Block 0", "Embedding"):
                self.tree.expand(idx)

    def _filter(self, text: str) -> None:
        self.proxy.setFilterFixedString(text.strip())
        if text.strip():
            self.tree.expandAll()

    def _current_changed(self, current, _previous) -> None:
        node = current.data(NodeRole) if current.isValid() else None
        if node is None:
            node = self.proxy.mapToSource(current).data(NodeRole) if current.isValid() else None
        if node is None:
            self.details.setText("")
            return
        text = node.tip or node.full_name or node.name
        self.details.setText(text.replace("\n", "   ·   "))

    # ---- actions --------------------------------------------------------------------------------
    def open_netron(self) -> None:
        info = self.ctl.model
        if isinstance(info, projects.OnnxGraph):
            path = info.path
        else:
            path = (self._graph_paths or {}).get(self.graph_combo.currentText())
        if path is None:
            return
        try:
            where = projects.open_in_netron(path)
        except Exception as exc:  # noqa: BLE001 - netron's own errors, shown to the user
            self.ctl.message.emit("error", f"Netron could not open {path}: {exc}")
            return
        self.ctl.message.emit("info", f"Netron serves {path.name} at {where}")


def main() -> int:
    return run_page(ModelPage)


if __name__ == "__main__":
    raise SystemExit(main())
