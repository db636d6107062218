"""Precision: the quantization recipe and the layer-precision editor.

The **layer grid** shows every layer the recipe can set — transformer blocks × module kinds,
plus the layers outside the blocks — with its weight and activation precision. Select cells
(a header selects a whole column or block) and set their precision from the context menu or
the side panel: the page turns the choice into override rules (``*.down_proj`` for a whole
column) through :mod:`studio.services.precision_edit` and pushes them as one undoable edit.
Choices the targets' HTP cannot run are refused with the reason
(:func:`studio.core.recipe.refusal`) and change nothing. The heat map colours the grid by a
real per-layer sensitivity analysis (the optional ``sensitivity`` stage), and **Apply** queues
quantize → compile → validate and shows the validation figures before and after.

Every control here is an undoable edit of the project (a ``SetValue`` on the core command
stack; Undo / Redo here and in the Edit menu mirror it).
"""

from __future__ import annotations

import asyncio

from PySide6.QtCore import Qt
from PySide6.QtGui import QKeySequence, QShortcut
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QPushButton,
    QScrollArea,
    QSplitter,
    QTableView,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from studio.core.errors import StudioError
from studio.core.modelinfo import ModelInfo
from studio.core.recipe import (
    PART_TITLES,
    PARTS,
    PRECISIONS,
)
from studio.services import history
from studio.services import sensitivity as sens
from studio.services.precision import (
    APPLY_STAGES,
    layer_precisions,
    scheme_diff,
    target_chips,
)
from studio.services.precision_edit import SCHEME_PART, plan_edit
from studio.ui.loading import LatestLoad
from studio.ui.models.rows import Row, RowsModel
from studio.ui.pages.base import Page
from studio.ui.pages.heatmap import HeatPanel
from studio.ui.pages.layergrid import LayerGrid
from studio.ui.pages.precision_recipe import RecipeFormMixin
from studio.ui.pages.precision_rules import RulesMixin
from studio.ui.pages.precision_views import BeforeAfterView, DiffView, diff_summary, selection_html
from studio.ui.stages import role_of
from studio.ui.standalone import run_page
from studio.ui.widgets import SourceBadge, label

LAYER_COLUMNS = ["Layer", "Block", "Kind", "Weights", "Activations", "Rule"]
#: the tabs of the page, in order
TABS = ("Layer grid", "Recipe", "Layer table", "Changes vs scheme", "Before / after")
#: settings the sensitivity result depends on (a change reloads it)
_SENS_KEYS = {("quantization", k) for k in (
    "scheme", "weight_granularity", "calibration_text", "calibration_samples")} | {
    ("validation", "heldout_text"), ("sensitivity", "heldout_tokens"), ("sensitivity", "high"),
    ("sensitivity", "low"), ("", "targets")}


def rule_text(row: dict) -> str:
    """One cell for the rule(s) of a layer-precision row: the rule when one rule set both
    (or the layer has no weights), else which rule set the weights and which the activations."""
    w, a = row["weight_rule"], row["activation_rule"]
    if not w or w == a:
        return a
    return f"weights: {w}; activations: {a}"


class PrecisionPage(RecipeFormMixin, RulesMixin, Page):
    key = "precision"

    def __init__(self, ctl, parent=None):
        super().__init__(ctl, parent)
        self.sensitivity: dict | None = None  # services.sensitivity.sensitivity_result
        self.sensitivity_loaded = False
        self._sens_load = LatestLoad(ctl)
        self._apply_before: int | None = None
        self._apply_task: asyncio.Task | None = None
        self._shortcuts: list[QShortcut] = []
        self._rows: list[dict] = []

        # -- header: undo / redo / apply --
        self.undo_button = QToolButton()
        self.undo_button.setText("↶ Undo")
        self.undo_button.clicked.connect(self.undo)
        self.redo_button = QToolButton()
        self.redo_button.setText("↷ Redo")
        self.redo_button.clicked.connect(self.redo)
        self.apply_button = QPushButton("Apply: quantize → compile → validate")
        self.apply_button.setToolTip(
            "Queue quantize, compile and validate for the recipe as it is now (the export is "
            "reused from the cache), then compare its validation figures with the last run "
            "before the edit (Before / after tab)")
        self.apply_button.clicked.connect(self.apply_recipe)
        for w in (self.undo_button, self.redo_button):
            self.header_tools.addWidget(w)
        self.header_tools.addSpacing(10)
        self.header_tools.addWidget(self.apply_button)

        lay = QVBoxLayout(self.body)
        lay.setContentsMargins(0, 6, 0, 0)
        self.tabs = QTabWidget()
        lay.addWidget(self.tabs, 1)
        self.status = label("", wrap=True, selectable=True)
        self.status.hide()
        lay.addWidget(self.status)

        self.tabs.addTab(self._build_grid_tab(), TABS[0])
        recipe = QScrollArea()
        recipe.setWidgetResizable(True)
        recipe.setFrameShape(QScrollArea.Shape.NoFrame)
        form = self._build_recipe()
        form.setMaximumWidth(760)
        recipe.setWidget(form)
        self.tabs.addTab(recipe, TABS[1])
        self.tabs.addTab(self._build_layer_table(), TABS[2])
        self.diff_view = DiffView()
        self.diff_view.view.doubleClicked.connect(self._diff_clicked)
        self.tabs.addTab(self.diff_view, TABS[3])
        self.before_after = BeforeAfterView()
        self.apply_now = self.before_after.empty.add_action(
            "Apply now", self.apply_recipe, "Queue quantize → compile → validate now")
        self.tabs.addTab(self.before_after, TABS[4])

        ctl.model_ready.connect(lambda _info: self._show_layers())
        ctl.undo_changed.connect(self._update_undo)
        ctl.running_changed.connect(self._running_changed)
        ctl.run_finished.connect(self._run_finished)
        self._update_undo()

    # ---- building ------------------------------------------------------------------------------
    def _build_grid_tab(self) -> QWidget:
        tab = QWidget()
        tl = QVBoxLayout(tab)
        tl.setContentsMargins(6, 6, 6, 6)
        top = QHBoxLayout()
        self.diff_line = label("", "muted", wrap=True)
        top.addWidget(self.diff_line, 1)
        self.diff_badge = SourceBadge("formula", "weight bytes = parameters × bytes per "
                                      "parameter of each layer's weight precision")
        top.addWidget(self.diff_badge, 0, Qt.AlignmentFlag.AlignTop)
        top.addSpacing(12)
        tl.addLayout(top)
        self.heat_check = QCheckBox("Heat map")
        self.heat_check.setToolTip("Colour the layers by their sensitivity: how much raising "
                                   "each alone improves accuracy (the sensitivity stage)")
        self.heat_check.toggled.connect(self._heat_toggled)
        self.heat_metric = QComboBox()
        for key, (_, title, unit, _sign) in sens.HEAT_METRICS.items():
            self.heat_metric.addItem(title + (f" ({unit})" if unit else ""), key)
            self.heat_metric.setItemData(self.heat_metric.count() - 1, sens.HEAT_HELP[key],
                                         Qt.ItemDataRole.ToolTipRole)
        self.heat_metric.setToolTip("The figure the heat map and the chart rank layers by")
        self.heat_metric.currentIndexChanged.connect(lambda _i: self._show_heat())
        self.heat_metric.setEnabled(False)

        split = QSplitter(Qt.Orientation.Horizontal)
        split.setChildrenCollapsible(False)
        left = QSplitter(Qt.Orientation.Vertical)
        left.setChildrenCollapsible(False)
        self.grid = LayerGrid()
        self.grid.context = lambda: (self._chips(), self.ctl.project.quantization["scheme"]
                                     if self.ctl.project else None)
        self.grid.selection_changed.connect(self._selection_changed)
        self.grid.edit_requested.connect(lambda part, prec: self.edit_selection(part, prec))
        self.grid.graph_requested.connect(self.graphActivated.emit)
        # the heat map's switch on the top row: beside the legend it pushed the legend onto
        # two lines in a 1280-px window
        top.addWidget(self.heat_check, 0, Qt.AlignmentFlag.AlignTop)
        top.addWidget(self.heat_metric, 0, Qt.AlignmentFlag.AlignTop)
        left.addWidget(self.grid)
        self.heat = HeatPanel()
        self.heat.layer_clicked.connect(lambda name: self.grid.select_layers([name]))
        self.heat.run_button.clicked.connect(self.run_sensitivity)
        left.addWidget(self.heat)
        left.setStretchFactor(0, 3)
        left.setStretchFactor(1, 2)
        split.addWidget(left)
        split.addWidget(self._build_side())
        split.setStretchFactor(0, 1)
        split.setStretchFactor(1, 0)
        split.setSizes([760, 360])
        self.grid_split = split
        tl.addWidget(split, 1)
        return tab

    def _build_side(self) -> QWidget:
        side = QWidget()
        side.setMinimumWidth(300)
        side.setMaximumWidth(460)
        sl = QVBoxLayout(side)
        sl.setContentsMargins(4, 0, 0, 0)
        sel = QGroupBox("Selection")
        sel_l = QVBoxLayout(sel)
        self.details = label("", wrap=True, selectable=True)
        self.details.setTextFormat(Qt.TextFormat.RichText)
        self.details.setAlignment(Qt.AlignmentFlag.AlignTop | Qt.AlignmentFlag.AlignLeft)
        scroll = QScrollArea()
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)
        scroll.setWidget(self.details)
        scroll.setMinimumHeight(120)
        sel_l.addWidget(scroll, 1)
        row = QHBoxLayout()
        self.part_combo = QComboBox()
        for part in PARTS:
            self.part_combo.addItem(PART_TITLES[part].capitalize(), part)
        self.part_combo.setToolTip("Weights: the weight tensor's precision. Activations: what "
                                   "the layer outputs. Whole layer: both (FP16 / FP32 keep the "
                                   "layer in float)")
        row.addWidget(self.part_combo)
        self.prec_combo = QComboBox()
        self.prec_combo.addItems(list(PRECISIONS))
        self.prec_combo.setCurrentText("INT16")
        row.addWidget(self.prec_combo)
        self.set_button = QPushButton("Set")
        self.set_button.setToolTip("Give the selected layers this precision (one undoable edit)")
        self.set_button.clicked.connect(
            lambda: self.edit_selection(self.part_combo.currentData(),
                                        self.prec_combo.currentText()))
        self.part_combo.currentIndexChanged.connect(lambda _: self._refresh_choices())
        row.addWidget(self.set_button)
        sel_l.addLayout(row)
        row = QHBoxLayout()
        row.addStretch(1)
        self.reset_button = QPushButton("Back to the scheme")
        self.reset_button.setToolTip("Remove the rules that set only the selected layers (and "
                                     "override wider rules for them)")
        self.reset_button.clicked.connect(lambda: self.edit_selection(SCHEME_PART, ""))
        row.addWidget(self.reset_button)
        sel_l.addLayout(row)
        sl.addWidget(sel, 3)
        sl.addWidget(self._build_rules(), 2)
        return side

    def _build_layer_table(self) -> QWidget:
        layers = QWidget()
        lyl = QVBoxLayout(layers)
        lyl.setContentsMargins(6, 6, 6, 6)
        lyl.addWidget(
            label(
                "What each layer gets under the recipe, and the rule that set it (the quantizer "
                "applies the same rule).",
                "muted",
                wrap=True,
            )
        )
        self.layers = RowsModel(LAYER_COLUMNS, self)
        self.layer_view = QTableView()
        self.layer_view.setModel(self.layers)
        self.layer_view.verticalHeader().hide()
        self.layer_view.setAlternatingRowColors(True)
        self.layer_view.setWordWrap(False)
        # full layer names, never elided: the column fits its longest name and the view
        # scrolls sideways when the names are wider than the page
        self.layer_view.setTextElideMode(Qt.TextElideMode.ElideNone)
        self.layer_view.setHorizontalScrollMode(QAbstractItemView.ScrollMode.ScrollPerPixel)
        lh = self.layer_view.horizontalHeader()
        lh.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        lh.setStretchLastSection(True)
        lyl.addWidget(self.layer_view, 1)
        return layers

    def select_layer(self, name: str) -> bool:
        """Show ``name`` (a layer or key activation, e.g. from the layer diff) selected in the
        grid, with its details in the side panel; False when the grid has no such cell."""
        self.tabs.setCurrentIndex(0)
        self.grid.select_layers([name])
        return name in self.grid.selected_layers()

    def reveal_layer(self, name: str) -> bool:
        return self.select_layer(name)

    # ---- session ------------------------------------------------------------------------------
    def on_open(self) -> None:
        self.error.hide()
        self.show_status("")
        self.sensitivity, self.sensitivity_loaded = None, False
        self._load_all()
        self._update_undo()
        self._running_changed(self.ctl.running)
        if self.ctl.model is not None:
            self._show_layers()
        else:
            self.ctl.load_model()
        self.load_sensitivity()
        self._show_latest_comparison()

    def on_show(self) -> None:
        self._ensure_shortcuts()
        if self.sensitivity_loaded:
            self.load_sensitivity()  # studio --batch may have run it since

    def on_change(self, change) -> None:
        self._load_all(change)
        if any(
            ("quantization", k) in change for k in ("overrides", "scheme", "weight_granularity")
        ) or ("", "targets") in change:
            self._show_layers()
        if change & _SENS_KEYS:
            self.load_sensitivity()

    # ---- undo / redo (the core command stack; the Edit menu mirrors the same) -------------------
    def undo(self) -> None:
        if self.ctl.studio is not None and self.ctl.studio.commands.can_undo:
            what = self.ctl.studio.commands.undo_text
            self.ctl.undo()
            self.show_status(f"Undone: {what}")

    def redo(self) -> None:
        if self.ctl.studio is not None and self.ctl.studio.commands.can_redo:
            what = self.ctl.studio.commands.redo_text
            self.ctl.redo()
            self.show_status(f"Redone: {what}")

    def _update_undo(self) -> None:
        s = self.ctl.studio
        can_undo, can_redo = bool(s and s.commands.can_undo), bool(s and s.commands.can_redo)
        self.undo_button.setEnabled(can_undo)
        self.redo_button.setEnabled(can_redo)
        keys = ("Ctrl+Z", "Ctrl+Shift+Z")
        self.undo_button.setToolTip(
            f"Undo: {s.commands.undo_text} ({keys[0]})" if can_undo else "Nothing to undo")
        self.redo_button.setToolTip(
            f"Redo: {s.commands.redo_text} ({keys[1]})" if can_redo else "Nothing to redo")

    def _ensure_shortcuts(self) -> None:
        """Ctrl+Z / Ctrl+Shift+Z when the page is shown alone (in the main window its Edit menu
        has them; two would make both ambiguous)."""
        if self._shortcuts or hasattr(self.window(), "undo_act"):
            return
        for seq, fn in ((QKeySequence.StandardKey.Undo, self.undo),
                        (QKeySequence.StandardKey.Redo, self.redo)):
            sc = QShortcut(QKeySequence(seq), self)
            sc.activated.connect(fn)
            self._shortcuts.append(sc)

    # ---- edits ------------------------------------------------------------------------------------
    def show_status(self, text: str, error: bool = False) -> None:
        """The page's status line: what an edit did, or why it was refused."""
        self.status.setProperty("role", "error" if error else "muted")
        self.status.style().unpolish(self.status)
        self.status.style().polish(self.status)
        self.status.setText(text)
        self.status.setVisible(bool(text))

    def _set(self, section: str, key: str, value, label: str = "") -> bool:
        p = self.ctl.project
        if p is None:
            return False
        current = getattr(p, section)[key] if section else getattr(p, key)
        if current == value and (not isinstance(value, dict) or list(current) == list(value)):
            return True
        try:
            self.ctl.set(section, key, value, label)
        except StudioError as exc:
            self.error.setText(exc.message)
            self.error.show()
            self.show_status(exc.message, error=True)
            self._load_all({(section, key)})  # show the project's value again
            return False
        self.error.hide()
        return True

    def _chips(self) -> list:
        try:
            return target_chips(self.ctl.project) if self.ctl.project else []
        except StudioError:
            return []

    def _info(self) -> ModelInfo | None:
        info = self.ctl.model
        return info if isinstance(info, ModelInfo) else None

    def edit_selection(self, part: str, precision: str, layers: list[str] | None = None) -> bool:
        """Give the selected layers (or ``layers``) ``precision`` for ``part`` as override
        rules, one undoable edit; a refused choice shows why and changes nothing."""
        info = self._info()
        if info is None or self.ctl.project is None:
            self.show_status("the model is still being read: try again in a moment", error=True)
            return False
        layers = self.grid.selected_layers() if layers is None else layers
        if not layers:
            self.show_status("select one or more cells of the grid first", error=True)
            return False
        before = self.ctl.project.quantization["overrides"]
        try:
            edit = plan_edit(self.ctl.project, info, layers, part, precision)
        except StudioError as exc:
            self.show_status(f"Refused: {exc.message}. Nothing was changed.", error=True)
            return False
        if not edit.changes(before):
            what = "the scheme's precisions" if part == SCHEME_PART else precision
            self.show_status(f"Nothing to change: the selection already has {what}.")
            return False
        if not self._set("quantization", "overrides", edit.overrides, edit.label):
            return False
        said = [edit.label + "."]
        if edit.rules:
            said.append("Rules written: " + ", ".join(edit.rules) + ".")
        if edit.removed:
            said.append("Rules no longer needed, removed: " + ", ".join(edit.removed) + ".")
        if edit.skipped:
            said.append(f"{len(edit.skipped)} selected layer(s) without weights left as they "
                        "were.")
        self.show_status(" ".join(said))
        return True

    # ---- override rules -----------------------------------------------------------------------------
    # ---- tables and grid ------------------------------------------------------------------------------
    def _show_layers(self) -> None:
        if self.ctl.studio is None:
            return
        info = self._info()
        self._show_overrides()
        if info is None:
            self.layers.set_rows([])
            self._rows = []
            self.grid.model.set_rows([])
            err = self.ctl.model
            self.diff_line.setText(err.message if isinstance(err, StudioError) else
                                   "Reading the model…")
            return
        self._rows = layer_precisions(self.ctl.project, info)
        self.grid.model.set_rows(self._rows)
        self._selection_changed(self.grid.selected_layers())
        diff = scheme_diff(self.ctl.project, info)
        self.diff_view.show_diff(diff)
        self.diff_line.setText(diff_summary(diff))
        self.diff_badge.setVisible(bool(diff["counts"]["layers"]))
        rows = []
        for r in self._rows:
            colors = {}
            if r["weight_rule"].startswith("override"):
                colors[3] = "#2f6fd6"
            if r["activation_rule"].startswith("override"):
                colors[4] = "#2f6fd6"
            if colors:
                colors[5] = "#2f6fd6"
            tip = (
                f"weights: {r['weight'] or 'none'} ({r['weight_rule'] or 'no weights'}); "
                f"activations: {r['activation']} ({r['activation_rule']})"
            )
            if r.get("tied_to"):
                tip += f"; shares its weight with {r['tied_to']}"
            rows.append(
                Row(
                    [
                        r["layer"],
                        "" if r["block"] is None else str(r["block"]),
                        r["kind"],
                        r["weight"] or "—",
                        r["activation"],
                        rule_text(r),
                    ],
                    payload=r,
                    tip=tip,
                    colors=colors,
                )
            )
        self.layers.set_rows(rows)

    def _selection_changed(self, names: list[str]) -> None:
        rows = [r for n in names if (r := self.grid.model.row_of(n)) is not None]
        self.details.setText(selection_html(rows, self._info(), self.sensitivity))
        for b in (self.set_button, self.reset_button):
            b.setEnabled(bool(rows))
        self._refresh_choices()

    def _refresh_choices(self) -> None:
        """The precision choices the targets' HTP refuses for the chosen part of the
        selection (the grid's rule, as its context menu) are greyed out with the reason as
        their tooltip; a refused current choice moves to the most precise one allowed (the
        default is never a refused choice)."""
        if self.ctl.project is None or not self.grid.selected_layers():
            return
        part = self.part_combo.currentData()
        model = self.prec_combo.model()
        allowed = []
        for i in range(self.prec_combo.count()):
            prec = self.prec_combo.itemText(i)
            why = self.grid.refusal_of(part, prec)
            item = model.item(i)
            item.setEnabled(why is None)
            item.setToolTip(f"Refused: {why}" if why else "")
            if why is None:
                allowed.append(prec)
        if allowed and self.prec_combo.currentText() not in allowed:
            best = next((p for p in ("INT16", "INT8", "FP16", "INT4") if p in allowed), allowed[0])
            self.prec_combo.setCurrentText(best)

    def _diff_clicked(self, index) -> None:
        name = self.diff_view.layer_at(index)
        if name:
            self.tabs.setCurrentIndex(0)
            self.grid.select_layers([name])

    # ---- sensitivity heat map ---------------------------------------------------------------------
    def load_sensitivity(self) -> asyncio.Future | None:
        """Read the project's sensitivity result in a thread (it hashes the inputs to tell a
        current result from a stale one); the heat map and the side panel follow."""
        studio = self.ctl.studio
        if studio is None:
            return None
        project = studio.project.copy()

        def done(result) -> None:
            self.sensitivity, self.sensitivity_loaded = result, True
            self.heat_metric.setEnabled(result is not None)
            self._show_heat()
            self._selection_changed(self.grid.selected_layers())

        def failed(exc: Exception) -> None:
            if not isinstance(exc, StudioError):
                raise exc  # a bug (a closed project's result is dropped before it gets here)
            done(None)

        return self._sens_load.start(sens.sensitivity_result, project, studio.jobs,
                                     studio.store, done=done, failed=failed)

    def _heat_toggled(self, _on: bool) -> None:
        self._show_heat()

    def _show_heat(self) -> None:
        """The ranked chart (or how to get one) below the grid; the grid's colours by
        sensitivity while the heat-map box is checked."""
        result = self.sensitivity
        if result is None:
            self.grid.set_heat(None)
            why = "" if self.sensitivity_loaded else "Looking for a result…"
            self.heat.show_empty(self.ctl.project.path if self.ctl.project else "FILE.qstudio",
                                 why=why)
            return
        metric = self.heat_metric.currentData()
        _, title, unit, _ = sens.HEAT_METRICS[metric]
        self.heat.show_result(result, metric)
        if self.heat_check.isChecked():
            data = result["data"]
            self.grid.set_heat(sens.heat(data, metric),
                               f"{unit or title} ({data.get('source', 'measured')} on "
                               f"{data.get('device', 'host-cpu')})",
                               sens.HEAT_FLOOR.get(metric, 0.0))
        else:
            self.grid.set_heat(None)

    def run_sensitivity(self):
        """Queue the sensitivity stage (and the export it needs) through the job queue."""
        task = self.run_role("sensitivity")
        if task is not None:
            self.show_status("Sensitivity queued: the heat map fills in when it finishes "
                             "(progress on the Jobs page).")
        return task

    def on_job_event(self, job) -> None:
        if job.state == "succeeded" and role_of(job.stage) == "sensitivity":
            self.later(self.load_sensitivity, 100)
        if (role_of(job.stage) == "sensitivity" and self.status.text().startswith(
                "Sensitivity queued") and job.state in ("succeeded", "failed", "cancelled")):
            # the queued line gives way to how it ended
            self.show_status({"succeeded": "Sensitivity finished: the heat map shows its "
                                           "result.",
                              "failed": f"Sensitivity failed: {job.message} (details on the "
                                        "Jobs page).",
                              "cancelled": "Sensitivity cancelled."}[job.state],
                             error=job.state == "failed")
        if self._apply_task is not None and job.state in ("running", "failed"):
            self.show_status(f"Applying the recipe: {job.label} {job.state}"
                             + (f" — {job.message}" if job.state == "failed" else "")
                             + " (details on the Jobs page).", error=job.state == "failed")

    # ---- apply and compare -------------------------------------------------------------------------
    def _running_changed(self, running: bool) -> None:
        has = self.ctl.studio is not None
        self.apply_button.setEnabled(has)
        self.apply_button.setToolTip(
            ("A run is going: this one is queued behind it (Queue page). " if running else "")
            + "Queue quantize, compile and validate for the recipe as it is now (the export is "
            "reused from the cache), then compare its validation figures with the last run "
            "before the edit (Before / after tab)")
        self.apply_now.setEnabled(has)

    def apply_recipe(self):
        """Queue quantize → compile → validate for the recipe as it is now; when the run ends,
        show its validation figures next to the last run's before the edit."""
        studio = self.ctl.studio
        if studio is None:
            return None
        runs = history.validation_runs(studio.project, studio.jobs, limit=1)
        before = runs[0].id if runs else None
        task = self.run_stages(list(APPLY_STAGES))
        if task is None:
            return None
        self._apply_before, self._apply_task = before, task
        self.show_status("Applying the recipe: quantize → compile → validate queued (progress on "
                         "the Jobs page); the Before / after tab shows the result.")
        return task

    def _run_finished(self, summary) -> None:
        if self._apply_task is None or self.ctl.studio is None:
            return
        self._apply_task = None
        studio = self.ctl.studio
        if summary is None or not any(role_of(j.stage) == "validate" and j.state == "succeeded"
                                      for j in summary.jobs):
            self.show_status(f"The applied run {summary.run_id if summary else ''} ended "
                             f"{summary.state if summary else 'with an error'} without "
                             "validation figures: see the Jobs page.", error=True)
            return
        self.before_after.show_runs(studio.project, studio.jobs, summary.run_id,
                                    self._apply_before)
        self.tabs.setCurrentIndex(TABS.index("Before / after"))
        self.show_status(f"Applied: run {summary.run_id} {summary.state}; its validation figures "
                         "are next to the last run's before the edit.")

    def _show_latest_comparison(self) -> None:
        """On opening: the newest validation run next to the one before it, when there are."""
        studio = self.ctl.studio
        runs = history.validation_runs(studio.project, studio.jobs, limit=2)
        if not runs:
            self.before_after.show_empty()
            return
        before = runs[1].id if len(runs) > 1 else None
        self.before_after.show_runs(studio.project, studio.jobs, runs[0].id, before,
                                    why="The newest validation run and the one before it "
                                    "(Apply shows your next edit here).")


def main() -> int:
    return run_page(PrecisionPage)


if __name__ == "__main__":
    raise SystemExit(main())
