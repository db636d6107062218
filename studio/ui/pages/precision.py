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
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLineEdit,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTableView,
    QTabWidget,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from studio.core.errors import StudioError
from studio.core.modelinfo import ModelInfo
from studio.core.project import STAGES
from studio.core.recipe import (
    BLOCK_SIZES,
    CALIBRATION_METHODS,
    GRANULARITIES,
    GRANULARITY_HELP,
    PART_TITLES,
    PARTS,
    PRECISIONS,
    SCHEME_HELP,
    SCHEMES,
    covers,
)
from studio.services import history
from studio.services import sensitivity as sens
from studio.services.precision import (
    APPLY_STAGES,
    layer_precisions,
    override_refusals,
    scheme_diff,
    target_chips,
)
from studio.services.precision_edit import SCHEME_PART, plan_edit
from studio.ui.models.rows import PayloadRole, Row, RowsModel
from studio.ui.pages.base import Page
from studio.ui.pages.heatmap import HeatPanel
from studio.ui.pages.layergrid import LayerGrid
from studio.ui.pages.precisionviews import BeforeAfterView, DiffView, diff_summary, selection_html
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


class PrecisionPage(Page):
    title = "Precision"
    subtitle = ("The quantization recipe and each layer's precision: select cells in the grid "
                "and set them; every edit is undoable.")

    def __init__(self, ctl, parent=None):
        super().__init__(ctl, parent)
        self.sensitivity: dict | None = None  # services.sensitivity.sensitivity_result
        self.sensitivity_loaded = False
        self._sens_task: asyncio.Future | None = None
        self._sens_gen = 0
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
        ctl.job_event.connect(self._job_event)
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
        self.grid.legend_row.addWidget(self.heat_check)
        self.grid.legend_row.addWidget(self.heat_metric)
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

    def _build_rules(self) -> QGroupBox:
        over = QGroupBox("Override rules (the last matching rule wins)")
        ol = QVBoxLayout(over)
        self.overrides = RowsModel(["Pattern", "Precision", "Layers"], self)
        self.over_view = QTableView()
        self.over_view.setModel(self.overrides)
        self.over_view.verticalHeader().hide()
        self.over_view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.over_view.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.over_view.setWordWrap(False)
        hh = self.over_view.horizontalHeader()
        hh.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        hh.setSectionResizeMode(1, QHeaderView.ResizeMode.ResizeToContents)
        hh.setSectionResizeMode(2, QHeaderView.ResizeMode.ResizeToContents)
        self.over_view.setToolTip(
            "Glob patterns on module paths: *.down_proj, model.layers.0 (a whole block); INT8 / "
            "INT16 set activations, INT4 weights, FP16 / FP32 keep the layer in float; a pattern "
            "ending in .weight sets the weights. Select a rule to edit it and see its layers.")
        ol.addWidget(self.over_view, 1)
        add = QHBoxLayout()
        self.pattern = QLineEdit()
        self.pattern.setPlaceholderText("pattern, e.g. *.down_proj")
        self.pattern.returnPressed.connect(self.add_override)
        add.addWidget(self.pattern, 1)
        self.prec = QComboBox()
        self.prec.addItems(list(PRECISIONS))
        self.prec.setCurrentText("INT16")
        add.addWidget(self.prec)
        ol.addLayout(add)
        buttons = QHBoxLayout()
        self.add_button = QPushButton("Add")
        self.add_button.setToolTip("Add the rule after the others (or replace the rule with the "
                                   "same pattern)")
        self.add_button.clicked.connect(self.add_override)
        buttons.addWidget(self.add_button)
        self.update_button = QPushButton("Update")
        self.update_button.setToolTip("Replace the selected rule, in its place, by the pattern "
                                      "and precision above")
        self.update_button.clicked.connect(self.update_override)
        buttons.addWidget(self.update_button)
        self.remove_button = QPushButton("Remove")
        self.remove_button.clicked.connect(self.remove_override)
        buttons.addWidget(self.remove_button)
        self.up_button = QToolButton()
        self.up_button.setText("▲")
        self.up_button.setToolTip("Move the rule up (earlier: later rules win over it)")
        self.up_button.clicked.connect(lambda: self.move_override(-1))
        buttons.addWidget(self.up_button)
        self.down_button = QToolButton()
        self.down_button.setText("▼")
        self.down_button.setToolTip("Move the rule down (later: it wins over earlier rules)")
        self.down_button.clicked.connect(lambda: self.move_override(1))
        buttons.addWidget(self.down_button)
        buttons.addStretch(1)
        ol.addLayout(buttons)
        self.over_view.selectionModel().selectionChanged.connect(self._rule_selected)
        self._rule_buttons()
        return over

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

    def _build_recipe(self) -> QWidget:
        left = QWidget()
        ll = QVBoxLayout(left)
        ll.setContentsMargins(6, 6, 6, 6)
        recipe = QGroupBox("Recipe")
        form = QFormLayout(recipe)
        self.scheme = QComboBox()
        for s in SCHEMES:
            self.scheme.addItem(s, s)
            self.scheme.setItemData(
                self.scheme.count() - 1, SCHEME_HELP[s], Qt.ItemDataRole.ToolTipRole
            )
        self.scheme.activated.connect(
            lambda _i: self._set("quantization", "scheme", self.scheme.currentData())
        )
        form.addRow("Scheme", self.scheme)
        self.granularity = QComboBox()
        for g in GRANULARITIES:
            self.granularity.addItem(g.replace("_", "-"), g)
        self.granularity.activated.connect(
            lambda _i: self._set(
                "quantization", "weight_granularity", self.granularity.currentData()
            )
        )
        for i, g in enumerate(GRANULARITIES):
            self.granularity.setItemData(i, GRANULARITY_HELP[g], Qt.ItemDataRole.ToolTipRole)
        form.addRow("Weight granularity", self.granularity)
        self.block_size = QComboBox()
        for b in BLOCK_SIZES:
            self.block_size.addItem(str(b), b)
        self.block_size.setToolTip("Input channels per scale for block-wise (per-block, LPBQ) "
                                   "4-bit weights")
        self.block_size.activated.connect(
            lambda _i: self._set("quantization", "block_size", self.block_size.currentData())
        )
        form.addRow("Block size (per-block)", self.block_size)
        self.method = QComboBox()
        for m in CALIBRATION_METHODS:
            self.method.addItem(m, m)
        self.method.setToolTip("How activation ranges are taken from the calibration data: "
                               "MinMax (full range), Entropy (KL), Percentile (clips outliers)")
        self.method.activated.connect(
            lambda _i: self._set("quantization", "calibration_method", self.method.currentData())
        )
        form.addRow("Calibration method", self.method)
        self.samples = QSpinBox()
        self.samples.setRange(1, 4096)
        self.samples.setKeyboardTracking(False)
        self.samples.setToolTip("Calibration windows of the calibration text fed to the FP32 model")
        self.samples.editingFinished.connect(
            lambda: self._set("quantization", "calibration_samples", self.samples.value())
        )
        form.addRow("Calibration samples", self.samples)
        calib = QHBoxLayout()
        self.calib_text = QLineEdit()
        self.calib_text.setReadOnly(True)
        calib.addWidget(self.calib_text, 1)
        choose = QPushButton("Choose…")
        choose.setToolTip("Use a text file of your own as calibration data")
        choose.clicked.connect(self._choose_calibration)
        calib.addWidget(choose)
        sample = QPushButton("Sample")
        sample.setToolTip("Use the shipped calibration text (Python source)")
        sample.clicked.connect(
            lambda: self._set("quantization", "calibration_text", "sample:calibration")
        )
        calib.addWidget(sample)
        form.addRow("Calibration text", calib)
        self.prompt_len = QSpinBox()
        self.prompt_len.setRange(1, 4095)
        self.prompt_len.setKeyboardTracking(False)
        self.prompt_len.setToolTip("P: the prefill graph's fixed prompt length")
        self.prompt_len.editingFinished.connect(
            lambda: self._set("export", "prompt_length", self.prompt_len.value())
        )
        form.addRow("Prompt length (P)", self.prompt_len)
        self.context_len = QSpinBox()
        self.context_len.setRange(2, 4096)
        self.context_len.setKeyboardTracking(False)
        self.context_len.setToolTip("C: the static KV cache length of the decode graph")
        self.context_len.editingFinished.connect(
            lambda: self._set("export", "context_length", self.context_len.value())
        )
        form.addRow("Context length (C)", self.context_len)
        ll.addWidget(recipe)

        gates = QGroupBox("Accuracy gates (a failing gate fails studio --batch)")
        gf = QFormLayout(gates)
        self.gate_spins: dict[str, QDoubleSpinBox] = {}
        for key, text, lo, hi in (
            ("min_logits_cosine", "Min logits cosine", 0.0, 1.0),
            ("max_perplexity_increase", "Max perplexity increase", 0.0, 100.0),
            ("min_top1_agreement", "Min top-1 agreement", 0.0, 1.0),
        ):
            spin = QDoubleSpinBox()
            spin.setRange(lo, hi)
            spin.setDecimals(4)
            spin.setSingleStep(0.01)
            spin.setKeyboardTracking(False)
            spin.editingFinished.connect(
                lambda k=key, s=spin: self._set("gates", k, round(s.value(), 6))
            )
            gf.addRow(text, spin)
            self.gate_spins[key] = spin
        ll.addWidget(gates)

        stages = QGroupBox("Pipeline stages (Run pipeline and studio --batch)")
        sl = QHBoxLayout(stages)
        self.stage_checks: dict[str, QCheckBox] = {}
        for s in STAGES:
            cb = QCheckBox(s)
            cb.clicked.connect(self._stages_clicked)
            sl.addWidget(cb)
            self.stage_checks[s] = cb
        sl.addStretch(1)
        ll.addWidget(stages)
        self.error = label("", "error", wrap=True)
        self.error.hide()
        ll.addWidget(self.error)
        ll.addStretch(1)
        return left

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

    def _load_all(self, change=None) -> None:
        p = self.ctl.project

        def touched(section: str, key: str) -> bool:
            return change is None or (section, key) in change

        q, e = p.quantization, p.export
        if touched("quantization", "scheme"):
            self._quiet(
                self.scheme, lambda: self.scheme.setCurrentIndex(self.scheme.findData(q["scheme"]))
            )
        if touched("quantization", "weight_granularity"):
            self._quiet(
                self.granularity,
                lambda: self.granularity.setCurrentIndex(
                    self.granularity.findData(q["weight_granularity"])
                ),
            )
        if touched("quantization", "block_size"):
            self._quiet(self.block_size, lambda: self.block_size.setCurrentIndex(
                self.block_size.findData(q["block_size"])))
        if touched("quantization", "weight_granularity"):
            self.block_size.setEnabled(q["weight_granularity"] == "per_block")
        if touched("quantization", "calibration_method"):
            self._quiet(self.method, lambda: self.method.setCurrentIndex(
                self.method.findData(q["calibration_method"])))
        if touched("quantization", "calibration_samples"):
            self._quiet(self.samples, lambda: self.samples.setValue(q["calibration_samples"]))
        if touched("quantization", "calibration_text"):
            self.calib_text.setText(q["calibration_text"])
        if touched("export", "prompt_length"):
            self._quiet(self.prompt_len, lambda: self.prompt_len.setValue(e["prompt_length"]))
        if touched("export", "context_length"):
            self._quiet(self.context_len, lambda: self.context_len.setValue(e["context_length"]))
        for key, spin in self.gate_spins.items():
            if touched("gates", key):
                self._quiet(spin, lambda s=spin, k=key: s.setValue(float(p.gates[k])))
        if touched("pipeline", "stages"):
            for s, cb in self.stage_checks.items():
                self._quiet(cb, lambda c=cb, s=s: c.setChecked(s in p.pipeline["stages"]))
        if touched("quantization", "overrides"):
            self._show_overrides()

    @staticmethod
    def _quiet(widget, fn) -> None:
        widget.blockSignals(True)
        try:
            fn()
        finally:
            widget.blockSignals(False)

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

    def _stages_clicked(self) -> None:
        stages = [s for s in STAGES if self.stage_checks[s].isChecked()]
        if not stages:
            self.error.setText("keep at least one stage in the pipeline")
            self.error.show()
            self._load_all({("pipeline", "stages")})
            return
        self._set("pipeline", "stages", stages)

    def _choose_calibration(self) -> None:
        path, _ = QFileDialog.getOpenFileName(
            self,
            "Calibration text",
            str(self.ctl.project.base_dir),
            "Text files (*.txt *.py *.md);;All files (*)",
        )
        if path:
            self._set("quantization", "calibration_text", path)

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
    def _selected_rule(self) -> str | None:
        rows = self.over_view.selectionModel().selectedRows()
        return rows[0].data(PayloadRole) if rows else None

    def _rule_buttons(self) -> None:
        rule = self._selected_rule()
        keys = list(self.ctl.project.quantization["overrides"]) if self.ctl.project else []
        for b in (self.update_button, self.remove_button):
            b.setEnabled(rule is not None)
        self.up_button.setEnabled(rule is not None and keys.index(rule) > 0)
        self.down_button.setEnabled(rule is not None and keys.index(rule) < len(keys) - 1)
        self.remove_button.setToolTip("Remove the selected rule" if rule else
                                      "Select a rule to remove it")

    def _rule_selected(self, *_args) -> None:
        rule = self._selected_rule()
        self._rule_buttons()
        if rule is None:
            return
        self.pattern.setText(rule)
        self.prec.setCurrentText(self.ctl.project.quantization["overrides"][rule])
        covered = [n for n in self.grid.model.layers() if covers(rule, n)]
        if covered:
            self.grid.select_layers(covered)

    def _check_rules(self, overrides: dict[str, str], changed: list[str]) -> bool:
        why = [w for w in override_refusals(self.ctl.project, self._info(),
                                            {k: overrides[k] for k in changed})]
        if why:
            self.show_status(f"Refused: {why[0]}. Nothing was changed.", error=True)
            self.error.setText(why[0])
            return False
        return True

    def add_override(self) -> bool:
        pattern = self.pattern.text().strip()
        if not pattern:
            self.error.setText("type a layer-name pattern first, e.g. *.down_proj")
            self.error.show()
            self.show_status("type a layer-name pattern first, e.g. *.down_proj", error=True)
            return False
        prec = self.prec.currentText()
        overrides = dict(self.ctl.project.quantization["overrides"])
        overrides.pop(pattern, None)  # added again: it goes last, and so wins
        overrides[pattern] = prec
        if not self._check_rules(overrides, [pattern]):
            return False
        if self._set("quantization", "overrides", overrides, f"Add rule {pattern} = {prec}"):
            self.pattern.clear()
            self.show_status(f"Rule {pattern} = {prec} added (last: it wins over the others).")
            return True
        return False

    def update_override(self) -> bool:
        old = self._selected_rule()
        pattern = self.pattern.text().strip()
        if old is None or not pattern:
            self.show_status("select a rule and type its new pattern first", error=True)
            return False
        prec = self.prec.currentText()
        overrides = {}
        for k, v in self.ctl.project.quantization["overrides"].items():
            if k == old:
                overrides[pattern] = prec
            elif k != pattern:
                overrides[k] = v
        if not self._check_rules(overrides, [pattern]):
            return False
        if self._set("quantization", "overrides", overrides,
                     f"Change rule {old} to {pattern} = {prec}"):
            self.show_status(f"Rule {old} is now {pattern} = {prec}.")
            self._select_rule(pattern)
            return True
        return False

    def remove_override(self) -> None:
        pattern = self._selected_rule()
        if pattern is None:
            return
        overrides = dict(self.ctl.project.quantization["overrides"])
        overrides.pop(pattern, None)
        if self._set("quantization", "overrides", overrides, f"Remove rule {pattern}"):
            self.show_status(f"Rule {pattern} removed.")

    def move_override(self, step: int) -> None:
        pattern = self._selected_rule()
        if pattern is None:
            return
        keys = list(self.ctl.project.quantization["overrides"])
        i = keys.index(pattern)
        j = i + step
        if not 0 <= j < len(keys):
            return
        keys[i], keys[j] = keys[j], keys[i]
        values = self.ctl.project.quantization["overrides"]
        if self._set("quantization", "overrides", {k: values[k] for k in keys},
                     f"Move rule {pattern} {'up' if step < 0 else 'down'}"):
            self._select_rule(pattern)

    def _select_rule(self, pattern: str) -> None:
        for r in range(self.overrides.rowCount()):
            if self.overrides.index(r, 0).data(PayloadRole) == pattern:
                self.over_view.selectRow(r)
                return

    # ---- tables and grid ------------------------------------------------------------------------------
    def _layer_names(self) -> list[str]:
        from studio.services.precision import quantizable

        info = self._info()
        return [name for name, *_ in quantizable(info)] if info is not None else []

    def _show_overrides(self) -> None:
        overrides = self.ctl.project.quantization["overrides"]
        keep = self._selected_rule()
        names = self._layer_names()
        rows = []
        for pattern, prec in overrides.items():
            n = sum(1 for name in names if covers(pattern, name))
            rows.append(
                Row(
                    [pattern, prec, str(n) if names else "?"],
                    payload=pattern,
                    colors={2: "#b26a00"} if names and n == 0 else {},
                    tip="No layer matches; the pattern may still name ONNX nodes (quantize "
                    "fails with a clear message if it names nothing)"
                    if names and n == 0
                    else f"{pattern} = {prec}: covers {n} layer(s)",
                )
            )
        self.over_view.selectionModel().blockSignals(True)
        self.overrides.set_rows(rows)
        self.over_view.selectionModel().blockSignals(False)
        if keep in overrides:
            self._select_rule(keep)
        else:
            self.over_view.clearSelection()
        self._rule_buttons()

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
        self._sens_gen += 1
        gen = self._sens_gen
        project = studio.project.copy()

        async def go() -> None:
            try:
                result = await self.ctl.in_thread(
                    sens.sensitivity_result, project, studio.jobs, studio.store)
            except StudioError:
                result = None
            if gen != self._sens_gen or self.ctl.studio is not studio:
                return
            self.sensitivity, self.sensitivity_loaded = result, True
            self.heat_metric.setEnabled(result is not None)
            self._show_heat()
            self._selection_changed(self.grid.selected_layers())

        try:
            self._sens_task = asyncio.ensure_future(go())
        except RuntimeError:  # no event loop (a bare QApplication)
            self._sens_task = None
        return self._sens_task

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
                                 can_run=not self.ctl.running, why=why)
            return
        metric = self.heat_metric.currentData()
        _, title, unit, _ = sens.HEAT_METRICS[metric]
        self.heat.show_result(result, metric)
        if self.heat_check.isChecked():
            self.grid.set_heat(sens.heat(result["data"], metric), unit or title.split(",")[0])
        else:
            self.grid.set_heat(None)

    def run_sensitivity(self):
        """Queue the sensitivity stage (and the export it needs) through the job queue."""
        task = self.run_stages(["sensitivity"])
        if task is not None:
            self.show_status("Sensitivity queued: the heat map fills in when it finishes "
                             "(progress on the Jobs page).")
        return task

    def _job_event(self, job) -> None:
        if self.ctl.studio is None:
            return
        if job.stage == "sensitivity" and job.state == "succeeded":
            self.later(self.load_sensitivity, 100)
        if self._apply_task is not None and job.state in ("running", "failed"):
            self.show_status(f"Applying the recipe: {job.label} {job.state}"
                             + (f" — {job.message}" if job.state == "failed" else "")
                             + " (details on the Jobs page).", error=job.state == "failed")

    # ---- apply and compare -------------------------------------------------------------------------
    def _running_changed(self, running: bool) -> None:
        self.apply_button.setEnabled(not running and self.ctl.studio is not None)
        self.apply_button.setToolTip(
            "A run is going: wait for it or cancel it (Jobs page)" if running else
            "Queue quantize, compile and validate for the recipe as it is now (the export is "
            "reused from the cache), then compare its validation figures with the last run "
            "before the edit (Before / after tab)")
        self.heat.run_button.setEnabled(not running)
        self.apply_now.setEnabled(not running and self.ctl.studio is not None)

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
        if summary is None or not any(j.stage == "validate" and j.state == "succeeded"
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
    from studio.ui.standalone import run_page

    return run_page(PrecisionPage)


if __name__ == "__main__":
    raise SystemExit(main())
