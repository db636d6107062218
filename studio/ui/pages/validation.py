"""Validation, run by run: pick a run with validation results and see, per target, FP32, host
QDQ and HTP figures side by side next to an earlier run's, with the changes and the settings
that differ between the two runs; the gates, the greedy text and every recorded figure of the
run's validate job. A second tab holds the layer diff of the current settings (FP32 vs host QDQ
vs the HTP, tensor by tensor: :class:`studio.ui.pages.layerdiff_view.LayerDiffView`)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtGui import QFont
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QPlainTextEdit,
    QPushButton,
    QTableView,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from studio.core.catalog import get_chip
from studio.core.errors import StudioError
from studio.core.gates import evaluate_gates
from studio.core.jobs import Job
from studio.services import history
from studio.ui.models.rows import Row, RowsModel
from studio.ui.pages.base import StagePage
from studio.ui.pages.figures import (
    FIGURE_TIPS,
    FIGURE_TITLES,
    SAME_COLOR,
    column_title,
    delta_color,
    fmt_delta,
    fmt_figure,
    fmt_metric,
    metric_title,
    run_label,
    setting_value,
)
from studio.ui.pages.layerdiff_view import LayerDiffView
from studio.ui.stages import article, places_nodes, project_kind, role_of
from studio.ui.standalone import run_page
from studio.ui.widgets import BadgeDelegate, label, splitter

GATE_TITLES = {
    "min_logits_cosine": "logits cosine ≥",
    "max_perplexity_increase": "perplexity increase ≤",
    "min_top1_agreement": "top-1 agreement ≥",
}
EMPTY_TEXT = (
    "Run the validate stage to compare, per target chip, the FP32 model (CPU) with the "
    "quantized model on the host and on the HTP simulator: logits cosine, max error, top-1 "
    "agreement, perplexity on held-out text and greedy-token agreement, checked against the "
    "project's gates. Each run's figures are kept: after a recipe change this page shows both "
    "runs side by side. The <b>Layer diff</b> tab compares FP32, host QDQ and the HTP tensor "
    "by tensor. Validation runs on the HTP simulator of each target chip; remote agents and "
    "phones over adb (Devices page) run the run and profile stages."
)
GRAPH_EMPTY_TEXT = (
    "This is {a} {kind} project: its validate stage ({stage}) compares each output of the "
    "deployed graph with the FP32 graph on the CPU (worst cosine, max |error|, on the held-out "
    "samples) and an encoder's rankings on the shipped retrieval set. Run validate (or the "
    "pipeline): the figures show on the <b>Placement</b> page beside the placement they were "
    "measured under, on the Overview and in the report."
)
ONE_RUN_TEXT = (
    "Only one run has validation results. Run the pipeline again after a change to compare: "
    "change the recipe on the Precision page (scheme, weight granularity, overrides), run "
    "validate, and both runs' figures show here side by side with what changed."
)


class FiguresModel(RowsModel):
    """The side-by-side table: column titles follow the run's devices; a figure's own row is
    bold, the earlier run's and the change rows under it are not."""

    def set_columns(self, columns: list[str]) -> None:
        if columns != self.columns:
            self.columns = list(columns)
            self.headerDataChanged.emit(Qt.Orientation.Horizontal, 0, len(columns) - 1)

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if role == Qt.ItemDataRole.FontRole:
            r = self.row(index.row())
            if r is not None and r.payload == "value":
                f = QFont()
                f.setBold(True)
                return f
            return None
        return super().data(index, role)


def _table(model, stretch: int | None = None) -> QTableView:
    view = QTableView()
    view.setModel(model)
    view.verticalHeader().hide()
    view.setWordWrap(False)
    view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
    h = view.horizontalHeader()
    h.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
    if stretch is None:
        h.setStretchLastSection(True)
    else:
        h.setSectionResizeMode(stretch, QHeaderView.ResizeMode.Stretch)
    vh = view.verticalHeader()
    vh.setDefaultSectionSize(view.fontMetrics().height() + 6)
    return view


def _combo(min_chars: int) -> QComboBox:
    c = QComboBox()
    c.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
    c.setMinimumContentsLength(min_chars)
    return c


class ValidationPage(StagePage):
    key = "validation"

    role = "validate"

    def __init__(self, ctl, parent=None):
        super().__init__(ctl, "No validation yet", EMPTY_TEXT, parent)
        self._runs: list[history.RunInfo] = []
        self._vjobs: dict[str, Job] = {}
        self._cmp: dict = {}
        self._sources: dict = {}
        self._build_sections()
        self._build_empty_actions()
        cl = self.content_layout
        cl.addLayout(self._build_pickers())
        cl.addLayout(self._build_summary())
        self.warning = label("", "error", wrap=True)
        cl.addWidget(self.warning)
        cl.addWidget(self._build_changes())
        split = splitter(Qt.Orientation.Horizontal, self._build_figures(), self._build_tabs(),
                         stretch=(0, 1))
        self.splitter = split
        cl.addWidget(split, 1)

    # ---- building the page ------------------------------------------------------------------
    def _build_sections(self) -> None:
        """Two sections: the runs' figures (the StagePage's empty state / content) and the
        layer diff of the current settings."""
        self.sections = QTabWidget()
        self.sections.setDocumentMode(True)
        runs = QWidget()
        rl = QVBoxLayout(runs)
        rl.setContentsMargins(0, 6, 0, 0)
        for w in (self.empty, self.content):
            self.body_layout.removeWidget(w)
            rl.addWidget(w, 1 if w is self.content else 0)
        self.sections.addTab(runs, "Run by run")
        self.layer_diff = LayerDiffView(self.ctl)
        self.layer_diff.layerActivated.connect(self.layerActivated)
        self.sections.addTab(self.layer_diff, "Layer diff")
        self.sections.setTabToolTip(
            1, "FP32 vs host QDQ vs the HTP simulator, tensor by tensor: where the error jumps "
            "and where host QDQ and the HTP part")
        self.body_layout.addWidget(self.sections, 1)

    def _build_empty_actions(self) -> None:
        self.add_run_action(
            "Run validate",
            "Runs the project's validate stage and what it needs (export or import, quantize, "
            "compile)",
        )
        self.placement_button = self.empty.add_action(
            "Open Placement", lambda: self.navigate.emit("placement"),
            "Encoders and ONNX graphs: placement and accuracy per target")
        self.layer_diff_button = self.empty.add_action(
            "Show the layer diff",
            lambda: self.sections.setCurrentWidget(self.layer_diff),
            "FP32 vs host QDQ vs the HTP, tensor by tensor",
        )

    def _build_pickers(self) -> QHBoxLayout:
        """The run and the target shown."""
        head = QHBoxLayout()
        head.addWidget(label("Run:"))
        self.run_combo = _combo(30)
        self.run_combo.setToolTip("The run whose figures are shown (runs with validation results)")
        self.run_combo.currentIndexChanged.connect(self._run_picked)
        head.addWidget(self.run_combo, 1)
        head.addSpacing(12)
        head.addWidget(label("Target:"))
        self.target = _combo(14)
        self.target.currentIndexChanged.connect(self.show_current)
        head.addWidget(self.target)
        return head

    def _build_summary(self) -> QHBoxLayout:
        line = QHBoxLayout()
        self.summary = label("", wrap=True, selectable=True)
        line.addWidget(self.summary, 1)
        self.job_label = label("", "muted")
        line.addWidget(self.job_label, 0, Qt.AlignmentFlag.AlignTop)
        return line

    def _build_changes(self) -> QGroupBox:
        """What changed from the run compared with, and the run to compare with."""
        self.changes_box = QGroupBox("What changed")
        chl = QVBoxLayout(self.changes_box)
        chl.setContentsMargins(8, 4, 8, 6)
        chl.setSpacing(4)
        pick = QHBoxLayout()
        self.against_label = label("Compared with:")
        pick.addWidget(self.against_label)
        self.against = _combo(30)
        self.against.setToolTip("The run to compare with (by default the one before)")
        self.against.currentIndexChanged.connect(self.show_run)
        pick.addWidget(self.against, 1)
        chl.addLayout(pick)
        said = QHBoxLayout()
        self.changes = label("", wrap=True, selectable=True)
        self.changes.setTextFormat(Qt.TextFormat.RichText)
        said.addWidget(self.changes, 1)
        self.recipe_button = QPushButton("Change the recipe…")
        self.recipe_button.setToolTip("Open the Precision page")
        self.recipe_button.clicked.connect(lambda: self.navigate.emit("precision"))
        said.addWidget(self.recipe_button, 0, Qt.AlignmentFlag.AlignVCenter)
        chl.addLayout(said)
        return self.changes_box

    def _build_figures(self) -> QGroupBox:
        """The side-by-side table: FP32, host QDQ and HTP per figure."""
        fbox = QGroupBox("Figures")
        fl = QVBoxLayout(fbox)
        fl.setContentsMargins(6, 6, 6, 6)
        self.figures = FiguresModel(["Figure", "FP32", "host QDQ", "HTP"], self)
        self.figure_view = _table(self.figures)
        self.figure_view.horizontalHeader().setStretchLastSection(False)
        self.figure_view.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        self.figure_view.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        badges = BadgeDelegate(self.figure_view)
        for c in (1, 2, 3):
            self.figure_view.setItemDelegateForColumn(c, badges)
        fl.addWidget(self.figure_view)
        self.figure_note = label("", "muted", wrap=True)
        fl.addWidget(self.figure_note)
        return fbox

    def _build_tabs(self) -> QTabWidget:
        """The gates, the greedy text and every recorded figure."""
        self.tabs = QTabWidget()
        self.tabs.addTab(self._build_gates(), "Gates")
        self.tabs.addTab(self._build_greedy(), "Greedy")
        allfig = QWidget()
        al = QVBoxLayout(allfig)
        al.setContentsMargins(6, 6, 6, 6)
        self.metrics = RowsModel(["Metric", "Value", "Source", "Device", "Target"], self)
        self.metric_view = _table(self.metrics)
        self.metric_view.setItemDelegateForColumn(2, BadgeDelegate(self.metric_view))
        al.addWidget(self.metric_view)
        self.tabs.addTab(allfig, "All figures")
        return self.tabs

    def _build_gates(self) -> QWidget:
        gates = QWidget()
        gl = QVBoxLayout(gates)
        gl.setContentsMargins(6, 6, 6, 6)
        self.gates = RowsModel(["Gate", "Limit", "Value", "Result"], self)
        self.gate_view = _table(self.gates, stretch=0)
        self.gate_view.horizontalHeader().setStretchLastSection(False)
        self.gate_view.setWordWrap(True)  # a narrow pane wraps a gate's name, never cuts it
        self.gate_view.verticalHeader().setSectionResizeMode(
            QHeaderView.ResizeMode.ResizeToContents
        )
        gl.addWidget(self.gate_view)
        gl.addWidget(label("Thresholds are edited on the Precision page.", "muted", wrap=True))
        return gates

    def _build_greedy(self) -> QWidget:
        greedy = QWidget()
        tl = QVBoxLayout(greedy)
        tl.setContentsMargins(6, 6, 6, 6)
        self.greedy_note = label("Greedy continuation of the run prompt", "muted", wrap=True)
        tl.addWidget(self.greedy_note)
        self.fp32_text = QPlainTextEdit()
        self.fp32_text.setReadOnly(True)
        self.htp_text = QPlainTextEdit()
        self.htp_text.setReadOnly(True)
        for title, w in (("FP32 (CPU)", self.fp32_text), ("quantized (HTP)", self.htp_text)):
            tl.addWidget(label(title, "muted"))
            tl.addWidget(w, 1)
        return greedy

    # ---- events -----------------------------------------------------------------------------
    def on_change(self, change) -> None:
        if any(s == "gates" for s, _ in change):
            self.show_current()
        self.layer_diff.schedule_reload()  # the settings decide which diff is current

    def on_close(self) -> None:
        self.layer_diff.clear()

    def on_job_event(self, job: Job) -> None:
        super().on_job_event(job)  # its own stage's jobs (and their running state)
        if job.state == "succeeded" and role_of(job.stage) == "layerdiff":
            self.later(self.refresh, self.refresh_ms)

    # ---- runs -------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-read the runs with validation results; keep the picked run unless it was the
        newest (then the new newest is shown)."""
        studio = self.ctl.studio
        graph = places_nodes(studio.project)
        self.placement_button.setVisible(graph)
        self.layer_diff_button.setVisible(not graph)
        if graph:
            self.set_has_content(False)
            self.empty.set_text("Validation of a graph", GRAPH_EMPTY_TEXT.format(
                a=article(project_kind(studio.project)), kind=project_kind(studio.project),
                stage=self.stage))
            return
        self.empty.set_text("No validation yet", EMPTY_TEXT)
        self.layer_diff.reload()
        runs = history.validation_runs(studio.project, studio.jobs)
        self._runs = runs
        if not self.set_has_content(bool(runs)):
            return
        current = self.run_combo.currentData()
        follow = current is None or self.run_combo.currentIndex() == 0
        self.run_combo.blockSignals(True)
        self.run_combo.clear()
        for r in runs:
            self.run_combo.addItem(run_label(r), r.id)
            self.run_combo.setItemData(
                self.run_combo.count() - 1,
                f"{run_label(r)}\nstages asked for: {', '.join(r.stages or ['the project’s'])}",
                Qt.ItemDataRole.ToolTipRole,
            )
        idx = 0 if follow else max(0, self.run_combo.findData(current))
        self.run_combo.setCurrentIndex(idx)
        self.run_combo.blockSignals(False)
        self._fit_popup(self.run_combo)
        self._fill_against()
        self.show_run()

    def _fit_popup(self, combo: QComboBox) -> None:
        view = combo.view()
        view.setMinimumWidth(view.sizeHintForColumn(0) + 24)

    def _run_picked(self, *_args) -> None:
        self._fill_against()
        self.show_run()

    def _fill_against(self) -> None:
        """The runs to compare with: every other run with validation results; by default
        the one before the picked run (none for the oldest)."""
        picked = self.run_combo.currentData()
        others = [r for r in self._runs if r.id != picked]
        self.against.blockSignals(True)
        self.against.clear()
        for r in others:
            self.against.addItem(run_label(r), r.id)
        self.against.addItem("nothing", None)
        before = next((i for i, r in enumerate(others) if r.id < (picked or 0)), len(others))
        self.against.setCurrentIndex(before)
        self.against.blockSignals(False)
        self._fit_popup(self.against)
        several = len(self._runs) > 1
        self.against.setVisible(several)
        self.against_label.setVisible(several)

    def reveal_run(self, run_id: int) -> bool:
        """Show run ``run_id`` when it has validation results."""
        try:
            self.pick_run(run_id)
        except StudioError:
            return False
        return True

    def pick_run(self, run_id: int, against: int | None = -1) -> None:
        """Show run ``run_id`` (compared with ``against``; -1: the one before it)."""
        i = self.run_combo.findData(run_id)
        if i < 0:
            raise StudioError(f"run {run_id} has no validation results")
        self.run_combo.setCurrentIndex(i)
        if against != -1:
            self.against.setCurrentIndex(self.against.findData(against))

    def show_run(self, *_args) -> None:
        studio = self.ctl.studio
        run_id = self.run_combo.currentData()
        if studio is None or run_id is None:
            return
        against = self.against.currentData() if len(self._runs) > 1 else None
        self._cmp = history.validation_compare(studio.jobs, run_id, against)
        self._sources = history.validation_sources(studio.jobs, run_id)
        self._vjobs = {
            j.target: j
            for j in studio.jobs.jobs(run_id=run_id)
            if j.stage == self.stage and j.state == "succeeded" and j.result
        }
        current = self.target.currentData()
        self.target.blockSignals(True)
        self.target.clear()
        for t in sorted(self._vjobs):
            self.target.addItem(t, t)
        self.target.setCurrentIndex(max(0, self.target.findData(current)))
        self.target.blockSignals(False)
        self._show_changes()
        self.show_current()
        self._jobs = sorted(self._vjobs.values(), key=lambda j: j.target)
        self.check_stale()  # the picked run's figures against the project as it is now

    # ---- what changed -----------------------------------------------------------------------
    def _show_changes(self) -> None:
        cmp = self._cmp
        run, against = cmp.get("run"), cmp.get("against")
        one = len(self._runs) < 2
        self.recipe_button.setVisible(one)
        if one:
            self.changes_box.setTitle("Compare with another run")
            self.changes.setText(ONE_RUN_TEXT)
            return
        if against is None:
            self.changes_box.setTitle("What changed")
            self.changes.setText(
                f"Run {run} is shown alone. Pick a run under <i>compared with</i> to see its "
                "figures next to these, with the changes and the settings that differ."
            )
            return
        self.changes_box.setTitle(f"What changed from run {against} to run {run}")
        if not cmp.get("settings_recorded"):
            self.changes.setText(
                f"Run {against} or run {run} did not record the settings it ran with (an older "
                "studio wrote it): the figures compare, the settings cannot."
            )
            return
        diff = cmp.get("settings") or []
        if not diff:
            self.changes.setText(
                "No setting changed between the two runs: any difference comes from the "
                "studio's stage code or tool versions."
            )
            return
        items = [
            f"<b>{d['key']}</b>: {setting_value(d['a'])} → {setting_value(d['b'])}" for d in diff
        ]
        self.changes.setText("; ".join(items))

    # ---- one target of the picked run -------------------------------------------------------
    def show_current(self, *_args) -> None:
        """Draw the picked target of the picked run again."""
        if self.ctl.studio is None or not self._vjobs:
            return
        job = self._vjobs.get(self.target.currentData()) or next(iter(self._vjobs.values()))
        self.show_job(job)

    def show_job(self, job: Job) -> None:
        res = job.result or {}
        self.job_label.setText(
            f"run {job.run_id} · job #{job.id}" + (" (cached)" if job.cached else "")
        )
        if job.cached:
            self.job_label.setToolTip(
                "Validate was not recomputed in this run: its inputs and settings were those "
                "of an earlier run, whose result is shown."
            )
        else:
            self.job_label.setToolTip("")
        self.summary.setText(res.get("summary", job.message))

        try:
            warns = get_chip(job.target).warnings()
        except StudioError:
            warns = []
        self.warning.setText("\n".join(warns))
        self.warning.setVisible(bool(warns))
        self._show_figures(job.target)
        self._show_gates(res)
        self.fp32_text.setPlainText(res.get("greedy_fp32", ""))
        self.htp_text.setPlainText(res.get("greedy_htp", ""))
        self._show_recorded(job)

    def _show_figures(self, target: str) -> None:
        against = self._cmp.get("against")
        run = self._cmp.get("run")
        rows_in = self._cmp.get("targets", {}).get(target, [])
        src = self._sources.get(target) or {
            "fp32": {"source": "measured", "device": "host-cpu"},
            "host_qdq": {"source": "measured", "device": "host-cpu"},
            "htp": {"source": "simulated", "device": "htp-sim"},
        }
        cols = list(history.VALIDATION_COLUMNS)
        self.figures.set_columns(
            ["Figure"] + [column_title(c, src[c]["device"]) for c in cols]
        )
        by_fig: dict[str, dict[str, dict]] = {}
        for r in rows_in:
            by_fig.setdefault(r["figure"], {})[r["column"]] = r
        rows = [
            Row(
                ["source"] + [src[c]["source"] for c in cols],
                tip="Where each column's figures come from: measured on the host CPU, or "
                "simulated (the QNN HTP simulator: real HTP numerics on this x86 machine)",
            )
        ]
        for fig in history.VALIDATION_FIGURES:
            cells = by_fig.get(fig)
            if cells:
                rows += self._figure_rows(fig, cells, cols, run, against)
        self.figures.set_rows(rows)
        self._fit_figures()
        if against is None:
            self.figure_note.setText(
                "FP32 is the reference the cosine, error and agreement figures are measured "
                "against."
            )
        else:
            self.figure_note.setText(
                f"Bold: run {run}. Under each figure: run {against} and the change "
                "(green better, red worse). FP32 is the reference the cosine, error and "
                "agreement figures are measured against."
            )

    def _figure_rows(self, fig: str, cells: dict[str, dict], cols: list[str], run,
                     against) -> list[Row]:
        """One figure's rows: its value per column, and (compared with a run) that run's
        value and the change."""
        right = (1, 2, 3)
        title = FIGURE_TITLES.get(fig, fig)
        rows = [
            Row(
                [title]
                + [
                    fmt_figure(fig, cells[c]["value"]) if c in cells else "—"
                    for c in cols
                ],
                tip=FIGURE_TIPS.get(fig, fig) + f" Run {run}.",
                colors={1: SAME_COLOR} if "fp32" not in cells else {},
                payload="value",
                align_right=right,
            )
        ]
        if against is None:
            return rows
        rows.append(
            Row(
                [f"    run {against}"]
                + [fmt_figure(fig, cells[c]["previous"]) if c in cells else "" for c in cols],
                tip=f"{title} in run {against}",
                colors={i: SAME_COLOR for i in range(4)},
                payload="previous",
                align_right=right,
            )
        )
        colors = {0: SAME_COLOR}
        for i, c in enumerate(cols, 1):
            if c in cells:
                colors[i] = delta_color(cells[c]["better"])
        rows.append(
            Row(
                ["    change"]
                + [
                    fmt_delta(fig, cells[c]["delta"], cells[c]["relative"]) if c in cells
                    else ""
                    for c in cols
                ],
                tip=f"run {run} minus run {against}: green is better, red is worse",
                colors=colors,
                payload="delta",
                align_right=right,
            )
        )
        return rows

    def _fit_figures(self) -> None:
        """Columns as wide as their contents, and the table never narrower than them (the
        splitter gives the tabs what is left)."""
        v = self.figure_view
        v.resizeColumnsToContents()
        h = v.horizontalHeader()
        width = sum(h.sectionSize(c) for c in range(self.figures.columnCount()))
        width += 2 * v.frameWidth() + v.verticalScrollBar().sizeHint().width() + 2
        v.setMinimumWidth(width)
        v.setMaximumWidth(width)

    def _show_gates(self, res: dict) -> None:
        grows = []
        for g in evaluate_gates(self.ctl.project.gates, res):
            ok = g["passed"]
            grows.append(
                Row(
                    [
                        GATE_TITLES.get(g["gate"], g["gate"]),
                        f"{g['threshold']:.4g}",
                        fmt_metric(g["gate"], g["value"]) if "cosine" in g["gate"]
                        else f"{g['value']:.4g}",
                        "pass" if ok else "FAIL",
                    ],
                    colors={3: "#1b8a3f" if ok else "#c62828"},
                    align_right=(1, 2),
                )
            )
        self.gates.set_rows(grows)

    def _show_recorded(self, job: Job) -> None:
        rows = []
        for m in self.ctl.studio.jobs.metrics(job_id=job.id):
            rows.append(
                Row(
                    [
                        metric_title(m.name),
                        fmt_metric(m.name, m.value, m.unit),
                        m.source,
                        m.device,
                        m.target or "—",
                    ],
                    tip=m.detail or m.name,
                    align_right=(1,),
                )
            )
        self.metrics.set_rows(rows)

    # ---- for tests and the report -----------------------------------------------------------
    def figure_rows(self) -> list[list[str]]:
        """The side-by-side table as text, header first."""
        m = self.figures
        out = [list(m.columns)]
        for r in range(m.rowCount()):
            out.append([m.index(r, c).data() for c in range(m.columnCount())])
        return out


def main() -> int:
    return run_page(ValidationPage)


if __name__ == "__main__":
    raise SystemExit(main())
