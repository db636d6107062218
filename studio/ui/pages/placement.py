"""Placement: where each node of an encoder's or an ONNX graph's quantized graph runs on a
target chip — the nodes the HTP refuses with the QNN EP's reason for each, the chosen way
forward (strict, partition, rewrite: a recipe setting, undoable), the NPU↔CPU transitions a
partition makes and the bytes they carry, the rewrites applied and their numeric check; and
the files to take away."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QPushButton,
    QVBoxLayout,
    QWidget,
)

from studio.core.errors import StudioError
from studio.core.recipe import PLACEMENT_HELP, PLACEMENTS
from studio.core.units import format_bytes
from studio.services import graphs
from studio.ui.loading import LatestLoad
from studio.ui.pages.base import Page
from studio.ui.stages import places_nodes, role_of
from studio.ui.standalone import run_page
from studio.ui.widgets import EmptyState, fill_table, label, read_only_table

#: the roles of the stages whose results the placement view shows: the placement itself
#: (quantize, compile) and the figures measured under it (validate, run)
PLACEMENT_ROLES = ("quantize", "compile", "validate", "run")



class PlacementPage(Page):
    key = "placement"

    def __init__(self, ctl, parent=None):
        super().__init__(ctl, parent)
        self._load = LatestLoad(ctl)
        self.view: dict[str, Any] | None = None
        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(0, 6, 0, 0)
        self.llm_note = EmptyState(
            "Placement is for encoder and ONNX graph projects",
            "A causal LM's prefill and decode graphs are placed strictly: every node on the "
            "NPU, or the compile stage fails naming the nodes (change their precision on the "
            "Precision page).")
        lay.addWidget(self.llm_note)
        self.graph_view = QWidget()
        gl = QVBoxLayout(self.graph_view)
        gl.setContentsMargins(0, 0, 0, 0)
        lay.addWidget(self.graph_view, 1)

        gl.addLayout(self._build_bar())
        self.not_yet = EmptyState(
            "The graph is not quantized with these settings yet",
            "Run the pipeline: the placement of the quantized graph on each target shows here, "
            "with the QNN EP's reason for every node the HTP refuses, the rewrites applied and "
            "what the placement costs in accuracy and time.")
        self.not_yet.add_action("Run pipeline", lambda: self.run_stages(None))
        gl.addWidget(self.not_yet, 1)
        self.details = QWidget()
        self.main = QVBoxLayout(self.details)
        self.main.setContentsMargins(0, 0, 0, 0)
        gl.addWidget(self.details, 1)
        self.not_yet.hide()  # until the first view is read
        self.details.hide()
        self.save_button.setEnabled(False)

        self._build_details()

    # ---- building the page ------------------------------------------------------------------
    def _build_bar(self) -> QHBoxLayout:
        """The way forward (a recipe setting), the target, run and save."""
        bar = QHBoxLayout()
        bar.addWidget(label("Way forward:"))
        self.way = QComboBox()
        for p in PLACEMENTS:
            self.way.addItem(p, p)
            self.way.setItemData(self.way.count() - 1, PLACEMENT_HELP[p],
                                 Qt.ItemDataRole.ToolTipRole)
        self.way.setToolTip("quantization.placement: a recipe setting (Undo takes it back)")
        self.way.activated.connect(self._way_chosen)
        bar.addWidget(self.way)
        self.way_help = label("", "muted", wrap=True)
        bar.addWidget(self.way_help, 1)
        bar.addWidget(label("Target:"))
        self.target = QComboBox()
        self.target.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToContents)
        self.target.currentIndexChanged.connect(lambda *_: self.refresh())
        bar.addWidget(self.target)
        self.run_button = QPushButton("Run pipeline")
        self.run_button.setToolTip("Import, quantize, compile, validate and run the graph with "
                                   "this way forward")
        self.run_button.clicked.connect(lambda: self.run_stages(None))
        bar.addWidget(self.run_button)
        self.save_button = QPushButton("Save files…")
        self.save_button.setToolTip("Copy the rewritten graph, the quantized graph, the "
                                    "placement report and the compiled context to a folder")
        self.save_button.clicked.connect(self.save_files)
        bar.addWidget(self.save_button)
        return bar

    def _build_details(self) -> None:
        """The placement of the picked target: refusals, crossings, rewrites, accuracy."""
        self.summary = label("", "heading", wrap=True)
        self.main.addWidget(self.summary)
        self.detail = label("", "muted", wrap=True)
        self.main.addWidget(self.detail)
        self.refused_title = label("Nodes the HTP refuses", "heading")
        self.main.addWidget(self.refused_title)
        self.refused = read_only_table(["node", "op", "the QNN EP's reason", "runs on",
                               "rewrite in the catalogue"], 2)
        self.main.addWidget(self.refused, 2)
        self.crossings_title = label("NPU↔CPU transitions", "heading")
        self.main.addWidget(self.crossings_title)
        self.crossings = read_only_table(["tensor", "from", "to", "bytes per inference"], 0)
        self.main.addWidget(self.crossings, 1)
        self.rewrites_title = label("Rewrites applied", "heading")
        self.main.addWidget(self.rewrites_title)
        self.rewrites = read_only_table(
            ["rewrite", "what it does", "places", "refused op it replaces"], 1)
        self.main.addWidget(self.rewrites, 1)
        self.check = label("", "muted", wrap=True)
        self.main.addWidget(self.check)
        self.accuracy_title = label("Accuracy against FP32 (the validate stage)", "heading")
        self.main.addWidget(self.accuracy_title)
        self.accuracy = read_only_table(
            ["output", "worst cosine (HTP)", "max |error| (HTP)", "source"], 0)
        self.main.addWidget(self.accuracy, 1)
        self.ranking = label("", "", wrap=True)
        self.main.addWidget(self.ranking)

    # ---- session ------------------------------------------------------------------------------
    def _graph_project(self) -> bool:
        return places_nodes(self.ctl.project)

    def on_open(self) -> None:
        graph = self._graph_project()
        self.llm_note.setVisible(not graph)
        self.graph_view.setVisible(graph)
        if not graph:
            return
        self.target.blockSignals(True)
        self.target.clear()
        for t in self.ctl.project.targets:
            self.target.addItem(t, t)
        self.target.blockSignals(False)
        self._show_way()
        self.refresh()

    def on_show(self) -> None:
        if self._graph_project():
            self.refresh()

    def on_change(self, change) -> None:
        if self._graph_project():
            self._show_way()
            self.later(self.refresh, 200)

    def on_job_event(self, job) -> None:
        if role_of(job.stage) in PLACEMENT_ROLES and job.state in ("succeeded", "failed"):
            self.later(self.refresh, 200)

    def _show_way(self) -> None:
        way = self.ctl.project.quantization["placement"]
        self.way.setCurrentIndex(self.way.findData(way))
        self.way_help.setText(PLACEMENT_HELP[way])

    def _way_chosen(self, _index: int) -> None:
        way = self.way.currentData()
        if way == self.ctl.project.quantization["placement"]:
            return
        try:
            self.ctl.set("quantization", "placement", way, f"Placement: {way}")
        except StudioError as exc:
            self.ctl.message.emit("error", exc.message)

    # ---- the view -----------------------------------------------------------------------------
    def refresh(self) -> None:
        if self.ctl.studio is None or not self._graph_project():
            return
        chip = self.target.currentData()
        if not chip:
            return
        self.summary.setText(f"Placing the quantized graph on {chip}…")
        project = self.ctl.project.copy()

        def failed(exc: Exception) -> None:
            self.view = None
            self.summary.setText(exc.message if isinstance(exc, StudioError)
                                 else f"placing the graph failed: {exc!r}")

        def done(view: dict[str, Any] | None) -> None:
            if self.target.currentData() == chip:
                self.show_view(view, chip)

        self._load.start(graphs.placement_view, project, chip, done=done, failed=failed)

    def show_view(self, view: dict[str, Any] | None, chip: str) -> None:
        self.view = view
        self.save_button.setEnabled(view is not None)
        for w in (self.refused_title, self.refused, self.crossings_title, self.crossings,
                  self.rewrites_title, self.rewrites, self.check):
            w.setVisible(view is not None)
        v = ((view or {}).get("measured") or {}).get("validate")
        for w in (self.accuracy_title, self.accuracy, self.ranking):
            w.setVisible(v is not None)
        if v is not None:
            self._show_accuracy(v)
        self.not_yet.setVisible(view is None)
        self.details.setVisible(view is not None)
        if view is None:
            return
        refused = [n for n in view["report"]["cpu_nodes"]
                   if n["op_type"] not in ("QuantizeLinear", "DequantizeLinear")]
        self._show_summary(view, chip, refused)
        self._show_tables(view, refused)

    def _show_accuracy(self, v: dict[str, Any]) -> None:
        """The validate stage's figures under this placement."""
        fill_table(self.accuracy, [[name, f"{o['cosine']:.5f}", f"{o['max_abs_error']:.4g}",
                                    v["source"]] for name, o in v["outputs"].items()])
        self.accuracy_title.setText(
            f"Accuracy against FP32 ({v['samples']} samples: {v.get('on', '')}; the "
            f"quantized graph on the host CPU: worst cosine "
            f"{v['host_qdq']['output_cosine_min']:.5f})")
        r = v.get("ranking")
        self.ranking.setText(
            f"Retrieval check ({r['queries']} queries over the shipped set, "
            f"{v['source']}): top-1 as FP32 for {r['top1_agreement']:.0%}, Kendall's tau "
            f"{r['mean_kendall_tau']:.3f}, recall@1 {r['recall_at_1_deployed']:.0%} (FP32 "
            f"{r['recall_at_1_reference']:.0%}), embedding cosine "
            f"{r['embedding_cosine_mean']:.4f}" if r else "")
        self.ranking.setVisible(bool(r))

    def _show_summary(self, view: dict[str, Any], chip: str, refused: list[dict]) -> None:
        """Where the nodes run, what the placement moves, and what it costs."""
        r = view["report"]
        way = view["placement"]
        on = f"{r['qnn_nodes']} of {r['total_nodes']} nodes on the NPU"
        if r["all_on_npu"]:
            self.summary.setText(f"{chip}: every node on the NPU ({r['total_nodes']} nodes, "
                                 f"{r['qnn_subgraphs']} subgraph)")
        elif view["state"] == "refused":
            self.summary.setText(f"{chip}: {len(refused)} node(s) refused — the {way} "
                                 "placement stops here")
        else:
            self.summary.setText(f"{chip}: {on}; the CPU takes {len(r['cpu_nodes'])} node(s)")
        bytes_ = r.get("bytes_crossing")
        moves = (f"{r.get('transitions', 0)} NPU↔CPU transition(s)"
                 + (f" carrying {format_bytes(bytes_)} per inference" if bytes_ else ""))
        if view["state"] == "refused":
            covered = [n for n in refused if n["op_type"] in view["catalogue"]]
            text = ("The compile stage stops here. Choose rewrite above"
                    + (f" (the catalogue covers {len(covered)} of the {len(refused)})"
                       if covered else " (no rewrite in the catalogue covers these ops)")
                    + f" or partition: the CPU would take them, with {moves}.")
        else:
            text = ({"compiled": "From the compile stage of the latest run",
                     "placed": "Placed just now: the compile stage has not run with these "
                               "settings"}[view["state"]]
                    + f". {moves}.")
        m = view.get("measured") or {}
        costs = []
        if "validate" in m:
            v = m["validate"]
            costs.append(f"worst output cosine vs FP32 {v['output_cosine_min']:.4f} "
                         f"({v['source']})")
        if "htp" in m:
            t = m["htp"]["latency"]
            costs.append(f"{t['median_ms']:.2f} ms per inference on the HTP simulator "
                         "(simulated: follows the host CPU, not device latency)")
        if "cpu" in m:
            costs.append(f"FP32 on the host CPU {m['cpu']['latency']['median_ms']:.2f} ms "
                         "(measured)")
        if costs:
            text += " With this placement: " + "; ".join(costs) + "."
        self.detail.setText(text)

    def _show_tables(self, view: dict[str, Any], refused: list[dict]) -> None:
        """The refused nodes, the NPU↔CPU crossings, the rewrites, the rewrite check."""
        r, way = view["report"], view["placement"]
        runs_on = "CPU (partition)" if way == "partition" else "nowhere: refused"
        fill_table(self.refused, [[n["name"], n["op_type"], n["reason"], runs_on,
                              view["catalogue"].get(n["op_type"], "none: partition")]
                             for n in refused], fit_rows=True)
        self.refused_title.setText(f"Nodes the HTP refuses ({len(refused)})")
        fill_table(self.crossings, [[c["tensor"], c["from"].upper(), c["to"].upper(),
                                format_bytes(c["bytes"]) if c["bytes"] is not None else "?"]
                               for c in r.get("crossings", [])])
        self.crossings_title.setText(
            ("NPU↔CPU transitions a partition would make" if view["state"] == "refused"
             else "NPU↔CPU transitions") + f" ({r.get('transitions', 0)})")
        fill_table(self.rewrites, [[w["rewrite"], w["description"], str(len(w["nodes"])),
                               w.get("refused") or "— (for quantization)"]
                              for w in view["rewrites"]])
        self.rewrites_title.setText(f"Rewrites applied ({len(view['rewrites'])})")
        for table in (self.refused, self.crossings, self.rewrites):  # "(0)" says it all
            table.setVisible(table.rowCount() > 0)
        c = view.get("rewrite_check")
        self.check.setText(
            f"The rewritten graph against the original (FP32, host CPU, {c['samples']} samples): "
            f"worst cosine {c['worst_cosine']:.6f}, max |error| {c['max_abs_error']:.3g} "
            "· measured" if c else "No rewrite applied: the graph is quantized as imported.")

    def save_files(self) -> None:
        if self.view is None:
            return
        d = QFileDialog.getExistingDirectory(self, "Save the graph files to")
        if d:
            self.save_to(Path(d))

    def save_to(self, folder: Path) -> list[Path]:
        assert self.view is not None
        try:
            files = graphs.save_placement_files(self.view, folder)
        except OSError as exc:
            self.ctl.message.emit("error", f"cannot write to {folder}: {exc.strerror}")
            return []
        self.ctl.message.emit("info", f"saved {', '.join(f.name for f in files)} to {folder}")
        return files


def main() -> int:
    return run_page(PlacementPage)


if __name__ == "__main__":
    raise SystemExit(main())
